"""An offline-model inference program in the style of the public pyACL samples' model wrapper.

Written for real NPUs: it only talks to ``acl``.  tests/core/test_acl_mdl.py runs it on vnpu after changing
its ``import acl`` line and nothing else.  The flow is the samples' one: init, set device, create a
context, load the .om, describe it, allocate one device buffer per input and output (sizes from the
description) and wrap them in one dataset per side, then per request copy the inputs in, set the batch
of a dynamic-batch model, execute, read the current output dims and copy the outputs out through pinned
host memory; finally destroy everything in the reverse order.

    python acl_model_sample.py --model m.om --inputs in.npz --batches 1,2,4 --output out.npz [--load mem]

``in.npz`` holds each model input by name at the largest batch; a request of batch b takes the first b
rows.  ``out.npz`` gets ``"<b>/<output index>"`` for every batch.
"""
import argparse
import sys

import numpy as np
import acl

# the samples define the constants they use themselves (constant.py)
ACL_SUCCESS = 0
ACL_HOST = 1
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_INFO, ACL_ERROR = 1, 3
DYNAMIC_BATCH_NAME = "ascend_mbatch_shape_data"
# aclDataType -> numpy
NP_TYPE = {0: np.float32, 1: np.float16, 2: np.int8, 3: np.int32, 4: np.uint8, 6: np.int16, 7: np.uint16,
           8: np.uint32, 9: np.int64, 10: np.uint64, 11: np.float64, 12: np.bool_}


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}".format(message, ret))


def log_info(msg):
    acl.app_log(ACL_INFO, "[acl_model_sample] " + msg)


class Model(object):
    def __init__(self, device_id, model_path, load_type="file"):
        self.device_id = device_id
        self.model_path = model_path
        self.load_type = load_type
        self.context = None
        self.model_id = None
        self.model_desc = None
        self.input_dataset = None
        self.output_dataset = None
        self.input_buffers = []           # {"buffer": dev ptr, "size": bytes}
        self.output_buffers = []
        self.dynamic_index = None
        self.batches = []
        self.init_resource()

    # ---------------------------------------------------------------- resources
    def init_resource(self):
        self.run_mode, ret = acl.rt.get_run_mode()
        check_ret("acl.rt.get_run_mode", ret)
        ret = acl.init()
        check_ret("acl.init", ret)
        ret = acl.rt.set_device(self.device_id)
        check_ret("acl.rt.set_device", ret)
        self.context, ret = acl.rt.create_context(self.device_id)
        check_ret("acl.rt.create_context", ret)

        if self.load_type == "mem":
            with open(self.model_path, "rb") as f:
                om_bytes = f.read()
            ptr = acl.util.bytes_to_ptr(om_bytes)
            self.model_id, ret = acl.mdl.load_from_mem(ptr, len(om_bytes))
            check_ret("acl.mdl.load_from_mem", ret)
        else:
            self.model_id, ret = acl.mdl.load_from_file(self.model_path)
            check_ret("acl.mdl.load_from_file", ret)
        log_info("model_id:{}".format(self.model_id))

        self.model_desc = acl.mdl.create_desc()
        ret = acl.mdl.get_desc(self.model_desc, self.model_id)
        check_ret("acl.mdl.get_desc", ret)

        index, ret = acl.mdl.get_input_index_by_name(self.model_desc, DYNAMIC_BATCH_NAME)
        if ret == ACL_SUCCESS:
            self.dynamic_index = index
            batch_info, ret = acl.mdl.get_dynamic_batch(self.model_desc)
            check_ret("acl.mdl.get_dynamic_batch", ret)
            self.batches = list(batch_info["batch"])
            log_info("dynamic batch gears {}".format(self.batches))

        self.input_buffers = self._malloc_buffers(acl.mdl.get_num_inputs(self.model_desc),
                                                  acl.mdl.get_input_size_by_index)
        self.output_buffers = self._malloc_buffers(acl.mdl.get_num_outputs(self.model_desc),
                                                   acl.mdl.get_output_size_by_index)
        self.input_dataset = self._gen_dataset(self.input_buffers)
        self.output_dataset = self._gen_dataset(self.output_buffers)
        log_info("init resource success")

    def _malloc_buffers(self, num, size_by_index):
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

    # ---------------------------------------------------------------- inference
    def run(self, arrays, batch=None):
        """arrays: the model's inputs (without the dynamic-batch one) as numpy arrays."""
        policy = ACL_MEMCPY_HOST_TO_DEVICE if self.run_mode == ACL_HOST else ACL_MEMCPY_DEVICE_TO_DEVICE
        for i, arr in enumerate(arrays):
            item = self.input_buffers[i]
            bytes_data = np.ascontiguousarray(arr).tobytes()
            if len(bytes_data) > item["size"]:
                raise Exception("input {} has {} bytes, the model takes {}".format(i, len(bytes_data), item["size"]))
            ptr = acl.util.bytes_to_ptr(bytes_data)
            ret = acl.rt.memcpy(item["buffer"], item["size"], ptr, len(bytes_data), policy)
            check_ret("acl.rt.memcpy", ret)
        if self.dynamic_index is not None:
            ret = acl.mdl.set_dynamic_batch_size(self.model_id, self.input_dataset, self.dynamic_index, batch)
            check_ret("acl.mdl.set_dynamic_batch_size", ret)
        ret = acl.mdl.execute(self.model_id, self.input_dataset, self.output_dataset)
        check_ret("acl.mdl.execute", ret)
        return self._outputs()

    def _outputs(self):
        results = []
        num = acl.mdl.get_dataset_num_buffers(self.output_dataset)
        for i in range(num):
            buf = acl.mdl.get_dataset_buffer(self.output_dataset, i)
            data = acl.get_data_buffer_addr(buf)
            dims, ret = acl.mdl.get_cur_output_dims(self.model_desc, i)
            check_ret("acl.mdl.get_cur_output_dims", ret)
            np_type = NP_TYPE[acl.mdl.get_output_data_type(self.model_desc, i)]
            shape = tuple(dims["dims"])
            size = int(np.prod(shape)) * np.dtype(np_type).itemsize
            if size > acl.get_data_buffer_size_v2(buf):
                raise Exception("output {} needs {} bytes".format(i, size))
            host, ret = acl.rt.malloc_host(size)
            check_ret("acl.rt.malloc_host", ret)
            ret = acl.rt.memcpy(host, size, data, size, ACL_MEMCPY_DEVICE_TO_HOST)
            check_ret("acl.rt.memcpy", ret)
            out = np.frombuffer(acl.util.ptr_to_bytes(host, size), dtype=np_type).reshape(shape)
            ret = acl.rt.free_host(host)
            check_ret("acl.rt.free_host", ret)
            results.append(out.copy())
        return results

    # ---------------------------------------------------------------- teardown
    def _release_dataset(self, dataset):
        if not dataset:
            return
        for i in range(acl.mdl.get_dataset_num_buffers(dataset)):
            data_buf = acl.mdl.get_dataset_buffer(dataset, i)
            if data_buf:
                ret = acl.destroy_data_buffer(data_buf)
                check_ret("acl.destroy_data_buffer", ret)
        ret = acl.mdl.destroy_dataset(dataset)
        check_ret("acl.mdl.destroy_dataset", ret)

    def release_resource(self):
        self._release_dataset(self.input_dataset)
        self._release_dataset(self.output_dataset)
        self.input_dataset = self.output_dataset = None
        ret = acl.mdl.unload(self.model_id)
        check_ret("acl.mdl.unload", ret)
        if self.model_desc:
            ret = acl.mdl.destroy_desc(self.model_desc)
            check_ret("acl.mdl.destroy_desc", ret)
            self.model_desc = None
        for item in self.input_buffers + self.output_buffers:
            ret = acl.rt.free(item["buffer"])
            check_ret("acl.rt.free", ret)
        self.input_buffers, self.output_buffers = [], []
        if self.context:
            ret = acl.rt.destroy_context(self.context)
            check_ret("acl.rt.destroy_context", ret)
            self.context = None
        ret = acl.rt.reset_device(self.device_id)
        check_ret("acl.rt.reset_device", ret)
        ret = acl.finalize()
        check_ret("acl.finalize", ret)
        log_info("release resource success")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--model", required=True)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--batches", default="")
    parser.add_argument("--output", required=True)
    parser.add_argument("--load", choices=["file", "mem"], default="file")
    args = parser.parse_args()

    model = Model(args.device, args.model, args.load)
    feeds = np.load(args.inputs)
    names = [acl.mdl.get_input_name_by_index(model.model_desc, i)
             for i in range(acl.mdl.get_num_inputs(model.model_desc)) if i != model.dynamic_index]
    batches = [int(b) for b in args.batches.split(",") if b] or [None]
    results = {}
    try:
        for b in batches:
            arrays = [feeds[n] if b is None else feeds[n][:b] for n in names]
            for i, out in enumerate(model.run(arrays, b)):
                results["{}/{}".format(b, i)] = out
                print("batch {} output {} {} {}".format(b, i, out.shape, out.dtype))
    finally:
        model.release_resource()
    np.savez(args.output, **results)
    print("run_mode {} done".format(model.run_mode))
    return 0


if __name__ == "__main__":
    sys.exit(main())
