"""An image-classification program with dynamic image size, in the style of the public pyACL sample
resnet50_imagenet_dynamic_hw (its acl_net.py: a ``Net`` that allocates the model's buffers once, copies a
picture in, looks up ``ascend_mbatch_shape_data``, checks the size against ``acl.mdl.get_dynamic_hw`` and
selects it with ``acl.mdl.set_dynamic_hw_size``, executes, reads the current output dims).

Written for real NPUs: it only talks to ``acl``.  tests/core/test_atc_dynamic_hw.py runs it on vnpu after
changing its ``import acl`` line and nothing else.  Unlike the public sample it copies only the picture's
own bytes into the input buffer (which is sized for the largest gear), so it runs at every gear.

    python acl_dynamic_hw_sample.py --model m.om --inputs in.npz --sizes 16x16,8x12 --output out.npz

``in.npz`` holds ``"<h>x<w>"``: the model's first input at that size (for a model with AIPP: the
picture's bytes); ``out.npz`` gets ``"<h>x<w>/<output index>"``, shaped by the current output dims.
"""
import argparse

import numpy as np
import acl

# constant.py of the samples
ACL_SUCCESS = 0
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_ERROR_GE_SHAPE_INVALID = 145021
DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
NP_TYPE = {0: np.float32, 1: np.float16, 3: np.int32, 4: np.uint8, 9: np.int64}


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}".format(message, ret))


class Net(object):
    def __init__(self, device_id, model_path):
        self.device_id = device_id
        self.model_path = model_path
        self.context = None
        self.model_id = None
        self.model_desc = None
        self.input_data = []
        self.output_data = []
        self.input_dataset = None
        self.output_dataset = None
        self.init_resource()

    def init_resource(self):
        print("init resource stage:")
        check_ret("acl.init", acl.init())
        check_ret("acl.rt.set_device", acl.rt.set_device(self.device_id))
        self.context, ret = acl.rt.create_context(self.device_id)
        check_ret("acl.rt.create_context", ret)
        self.model_id, ret = acl.mdl.load_from_file(self.model_path)
        check_ret("acl.mdl.load_from_file", ret)
        self.model_desc = acl.mdl.create_desc()
        check_ret("acl.mdl.get_desc", acl.mdl.get_desc(self.model_desc, self.model_id))
        self.input_data = self._gen_data_buffer(acl.mdl.get_num_inputs(self.model_desc),
                                                acl.mdl.get_input_size_by_index)
        self.output_data = self._gen_data_buffer(acl.mdl.get_num_outputs(self.model_desc),
                                                 acl.mdl.get_output_size_by_index)
        self.input_dataset = self._gen_dataset(self.input_data)
        self.output_dataset = self._gen_dataset(self.output_data)
        print("init resource success")

    def _gen_data_buffer(self, num, size_by_index):
        buffers = []
        for i in range(num):
            size = size_by_index(self.model_desc, i)
            buf, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
            check_ret("acl.rt.malloc", ret)
            buffers.append({"buffer": buf, "size": size})
        return buffers

    def _gen_dataset(self, buffers):
        dataset = acl.mdl.create_dataset()
        for item in buffers:
            data = acl.create_data_buffer(item["buffer"], item["size"])
            _, ret = acl.mdl.add_dataset_buffer(dataset, data)
            if ret != ACL_SUCCESS:
                acl.destroy_data_buffer(data)
                check_ret("acl.mdl.add_dataset_buffer", ret)
        return dataset

    def _set_dynamic_info(self, height, width):
        index, ret = acl.mdl.get_input_index_by_name(self.model_desc, DYNAMIC_TENSOR_NAME)
        check_ret("acl.mdl.get_input_index_by_name", ret)
        hw_info, ret = acl.mdl.get_dynamic_hw(self.model_desc, index)
        check_ret("acl.mdl.get_dynamic_hw", ret)
        if [height, width] not in hw_info["hw"]:
            check_ret("[dynamic hw] {} is not in {}".format([height, width], hw_info["hw"]),
                      ACL_ERROR_GE_SHAPE_INVALID)
        ret = acl.mdl.set_dynamic_hw_size(self.model_id, self.input_dataset, index, height, width)
        check_ret("acl.mdl.set_dynamic_hw_size", ret)

    def forward(self, picture, height, width):
        item = self.input_data[0]
        bytes_data = np.ascontiguousarray(picture).tobytes()
        if len(bytes_data) > item["size"]:
            raise Exception("the picture has {} bytes, the model takes at most {}".format(len(bytes_data),
                                                                                          item["size"]))
        ptr = acl.util.bytes_to_ptr(bytes_data)
        ret = acl.rt.memcpy(item["buffer"], item["size"], ptr, len(bytes_data), ACL_MEMCPY_HOST_TO_DEVICE)
        check_ret("acl.rt.memcpy", ret)
        self._set_dynamic_info(height, width)
        ret = acl.mdl.execute(self.model_id, self.input_dataset, self.output_dataset)
        check_ret("acl.mdl.execute", ret)
        return self.get_result()

    def get_result(self):
        result = []
        for i, item in enumerate(self.output_data):
            dims, ret = acl.mdl.get_cur_output_dims(self.model_desc, i)
            check_ret("acl.mdl.get_cur_output_dims", ret)
            np_type = NP_TYPE[acl.mdl.get_output_data_type(self.model_desc, i)]
            shape = tuple(dims["dims"])
            size = int(np.prod(shape)) * np.dtype(np_type).itemsize
            host, ret = acl.rt.malloc_host(size)
            check_ret("acl.rt.malloc_host", ret)
            ret = acl.rt.memcpy(host, size, item["buffer"], size, ACL_MEMCPY_DEVICE_TO_HOST)
            check_ret("acl.rt.memcpy", ret)
            data = np.frombuffer(acl.util.ptr_to_bytes(host, size), dtype=np_type).reshape(shape)
            check_ret("acl.rt.free_host", acl.rt.free_host(host))
            result.append(data.copy())
        return result

    def release_resource(self):
        print("Releasing resources stage:")
        for dataset in (self.input_dataset, self.output_dataset):
            for i in range(acl.mdl.get_dataset_num_buffers(dataset)):
                check_ret("acl.destroy_data_buffer",
                          acl.destroy_data_buffer(acl.mdl.get_dataset_buffer(dataset, i)))
            check_ret("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset(dataset))
        check_ret("acl.mdl.unload", acl.mdl.unload(self.model_id))
        check_ret("acl.mdl.destroy_desc", acl.mdl.destroy_desc(self.model_desc))
        for item in self.input_data + self.output_data:
            check_ret("acl.rt.free", acl.rt.free(item["buffer"]))
        check_ret("acl.rt.destroy_context", acl.rt.destroy_context(self.context))
        check_ret("acl.rt.reset_device", acl.rt.reset_device(self.device_id))
        check_ret("acl.finalize", acl.finalize())
        print("Resources released successfully.")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--sizes", required=True, help="h1xw1,h2xw2,...")
    parser.add_argument("--output", required=True)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    net = Net(args.device, args.model)
    results = {}
    with np.load(args.inputs) as feeds:
        for size in args.sizes.split(","):
            h, w = (int(v) for v in size.split("x"))
            print("execute stage: {}x{}".format(h, w))
            for i, out in enumerate(net.forward(feeds[size], h, w)):
                results["{}/{}".format(size, i)] = out
    np.savez(args.output, **results)
    net.release_resource()
    print("*****run finish******")
