"""An image-classification program in the style of the public pyACL samples' DVPP pipeline
(vpc_resnet50_imagenet_classification: JPEG -> DVPP -> a model with AIPP -> single operators).

Written for real NPUs: it only talks to ``acl``.  tests/core/test_dvpp_classify.py runs it on vnpu after
changing its ``import acl`` line and nothing else.  Per JPEG of ``--images``: read its header
(``dvpp_jpeg_get_image_info``), copy it into DVPP memory, decode it to YUV420SP (JPEGD), resize that to
the model's input size (VPC), run the model -- compiled with AIPP, so it takes the DVPP picture as it is
-- and turn its scores into a label with the single operators ``Cast`` (float32 -> float16) and
``ArgMaxV2`` (from ``--op_models``), all on one stream with one synchronize per stage, as the samples do.

    python acl_dvpp_classify_sample.py --model m.om --op_models ops --images imgs --width 32 --height 32
                                       --classes 10 --output out.npz
"""
import argparse
import os

import numpy as np
import acl

ACL_SUCCESS = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEMCPY_HOST_TO_DEVICE, ACL_MEMCPY_DEVICE_TO_HOST = 1, 2
PIXEL_FORMAT_YUV_SEMIPLANAR_420 = 1
ACL_FLOAT, ACL_FLOAT16, ACL_INT32, ACL_FORMAT_ND = 0, 1, 3, 2


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}: {}".format(message, ret, acl.get_recent_err_msg()))


def align_up(value, align):
    return (value + align - 1) // align * align


class Dvpp:
    def __init__(self, stream, width, height):
        self.stream, self.width, self.height = stream, width, height
        self.channel_desc = acl.media.dvpp_create_channel_desc()
        check_ret("acl.media.dvpp_create_channel", acl.media.dvpp_create_channel(self.channel_desc))
        self.resize_config = acl.media.dvpp_create_resize_config()

    def picture(self, buffer, size, width, height, width_stride, height_stride):
        desc = acl.media.dvpp_create_pic_desc()
        acl.media.dvpp_set_pic_desc_data(desc, buffer)
        acl.media.dvpp_set_pic_desc_size(desc, size)
        acl.media.dvpp_set_pic_desc_format(desc, PIXEL_FORMAT_YUV_SEMIPLANAR_420)
        acl.media.dvpp_set_pic_desc_width(desc, width)
        acl.media.dvpp_set_pic_desc_height(desc, height)
        acl.media.dvpp_set_pic_desc_width_stride(desc, width_stride)
        acl.media.dvpp_set_pic_desc_height_stride(desc, height_stride)
        return desc

    def decode(self, jpeg_bytes):
        host_ptr = acl.util.bytes_to_ptr(jpeg_bytes)
        width, height, _, ret = acl.media.dvpp_jpeg_get_image_info(host_ptr, len(jpeg_bytes))
        check_ret("acl.media.dvpp_jpeg_get_image_info", ret)
        size, ret = acl.media.dvpp_jpeg_predict_dec_size(host_ptr, len(jpeg_bytes), PIXEL_FORMAT_YUV_SEMIPLANAR_420)
        check_ret("acl.media.dvpp_jpeg_predict_dec_size", ret)
        jpeg_dev, ret = acl.media.dvpp_malloc(len(jpeg_bytes))
        check_ret("acl.media.dvpp_malloc", ret)
        check_ret("acl.rt.memcpy", acl.rt.memcpy(jpeg_dev, len(jpeg_bytes), host_ptr, len(jpeg_bytes),
                                                 ACL_MEMCPY_HOST_TO_DEVICE))
        out_dev, ret = acl.media.dvpp_malloc(size)
        check_ret("acl.media.dvpp_malloc", ret)
        desc = self.picture(out_dev, size, width, height, align_up(width, 128), align_up(height, 16))
        check_ret("acl.media.dvpp_jpeg_decode_async",
                  acl.media.dvpp_jpeg_decode_async(self.channel_desc, jpeg_dev, len(jpeg_bytes), desc, self.stream))
        check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        acl.media.dvpp_free(jpeg_dev)
        return desc, out_dev

    def resize(self, in_desc):
        w, h = align_up(self.width, 16), align_up(self.height, 2)
        size = w * h * 3 // 2
        out_dev, ret = acl.media.dvpp_malloc(size)
        check_ret("acl.media.dvpp_malloc", ret)
        out_desc = self.picture(out_dev, size, self.width, self.height, w, h)
        check_ret("acl.media.dvpp_vpc_resize_async",
                  acl.media.dvpp_vpc_resize_async(self.channel_desc, in_desc, out_desc, self.resize_config,
                                                  self.stream))
        check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        return out_desc, out_dev, size

    def release(self):
        acl.media.dvpp_destroy_resize_config(self.resize_config)
        check_ret("acl.media.dvpp_destroy_channel", acl.media.dvpp_destroy_channel(self.channel_desc))
        acl.media.dvpp_destroy_channel_desc(self.channel_desc)


class Model:
    def __init__(self, path, classes):
        self.model_id, ret = acl.mdl.load_from_file(path)
        check_ret("acl.mdl.load_from_file", ret)
        self.desc = acl.mdl.create_desc()
        check_ret("acl.mdl.get_desc", acl.mdl.get_desc(self.desc, self.model_id))
        self.out_size = acl.mdl.get_output_size_by_index(self.desc, 0)
        assert self.out_size == classes * 4, self.out_size
        self.out_dev, ret = acl.rt.malloc(self.out_size, ACL_MEM_MALLOC_NORMAL_ONLY)
        check_ret("acl.rt.malloc", ret)

    def run(self, picture, size):
        inputs, outputs = acl.mdl.create_dataset(), acl.mdl.create_dataset()
        in_buf = acl.create_data_buffer(picture, size)
        out_buf = acl.create_data_buffer(self.out_dev, self.out_size)
        check_ret("acl.mdl.add_dataset_buffer", acl.mdl.add_dataset_buffer(inputs, in_buf)[1])
        check_ret("acl.mdl.add_dataset_buffer", acl.mdl.add_dataset_buffer(outputs, out_buf)[1])
        check_ret("acl.mdl.execute", acl.mdl.execute(self.model_id, inputs, outputs))
        for ds in (inputs, outputs):
            check_ret("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset(ds))
        check_ret("acl.destroy_data_buffer", acl.destroy_data_buffer(in_buf))
        return out_buf

    def release(self):
        check_ret("acl.mdl.unload", acl.mdl.unload(self.model_id))
        check_ret("acl.mdl.destroy_desc", acl.mdl.destroy_desc(self.desc))
        check_ret("acl.rt.free", acl.rt.free(self.out_dev))


class Top1:
    def __init__(self, stream, classes, op_models):
        self.stream, self.classes = stream, classes
        check_ret("acl.op.set_model_dir", acl.op.set_model_dir(op_models))
        self.f32 = acl.create_tensor_desc(ACL_FLOAT, [classes], ACL_FORMAT_ND)
        self.f16 = acl.create_tensor_desc(ACL_FLOAT16, [classes], ACL_FORMAT_ND)
        self.dim = acl.create_tensor_desc(ACL_INT32, [1], ACL_FORMAT_ND)
        zero = bytes(4)
        check_ret("acl.set_tensor_const", acl.set_tensor_const(self.dim, acl.util.bytes_to_ptr(zero), 4))
        self.label_desc = acl.create_tensor_desc(ACL_INT32, [1], ACL_FORMAT_ND)
        self.half_dev, ret = acl.rt.malloc(classes * 2, ACL_MEM_MALLOC_NORMAL_ONLY)
        check_ret("acl.rt.malloc", ret)
        self.label_dev, ret = acl.rt.malloc(4, ACL_MEM_MALLOC_NORMAL_ONLY)
        check_ret("acl.rt.malloc", ret)
        self.attr = acl.op.create_attr()

    def run(self, scores_buf):
        half = acl.create_data_buffer(self.half_dev, self.classes * 2)
        label = acl.create_data_buffer(self.label_dev, 4)
        const = acl.create_data_buffer(0, 0)
        check_ret("acl.op.cast", acl.op.cast(self.f32, scores_buf, self.f16, half, 0, self.stream))
        check_ret("acl.op.execute_v2", acl.op.execute_v2("ArgMaxV2", [self.f16, self.dim], [half, const],
                                                         [self.label_desc], [label], self.attr, self.stream))
        check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        host = np.zeros(1, np.int32)
        check_ret("acl.rt.memcpy", acl.rt.memcpy(acl.util.numpy_to_ptr(host), 4, self.label_dev, 4,
                                                 ACL_MEMCPY_DEVICE_TO_HOST))
        for b in (half, label, const):
            check_ret("acl.destroy_data_buffer", acl.destroy_data_buffer(b))
        return int(host[0])

    def release(self):
        acl.op.destroy_attr(self.attr)
        for d in (self.f32, self.f16, self.dim, self.label_desc):
            acl.destroy_tensor_desc(d)
        for p in (self.half_dev, self.label_dev):
            check_ret("acl.rt.free", acl.rt.free(p))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--op_models", required=True)
    p.add_argument("--images", required=True)
    p.add_argument("--width", type=int, default=224)
    p.add_argument("--height", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--output", required=True)
    a = p.parse_args()
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(0))
    context, ret = acl.rt.create_context(0)
    check_ret("acl.rt.create_context", ret)
    stream, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)
    dvpp, model, top1 = Dvpp(stream, a.width, a.height), Model(a.model, a.classes), Top1(stream, a.classes,
                                                                                          a.op_models)
    out = {}
    for name in sorted(os.listdir(a.images)):
        if not name.endswith(".jpg"):
            continue
        with open(os.path.join(a.images, name), "rb") as f:
            jpeg = f.read()
        decoded, decoded_dev = dvpp.decode(jpeg)
        resized, resized_dev, size = dvpp.resize(decoded)
        scores_buf = model.run(resized_dev, size)
        label = top1.run(scores_buf)
        host = np.zeros(a.classes, np.float32)
        check_ret("acl.rt.memcpy", acl.rt.memcpy(acl.util.numpy_to_ptr(host), host.nbytes, model.out_dev,
                                                 host.nbytes, ACL_MEMCPY_DEVICE_TO_HOST))
        print("[Sample] {} label:{}".format(name, label))
        out[name + "/scores"], out[name + "/label"] = host, np.array([label])
        check_ret("acl.destroy_data_buffer", acl.destroy_data_buffer(scores_buf))
        for desc, dev in ((decoded, decoded_dev), (resized, resized_dev)):
            acl.media.dvpp_destroy_pic_desc(desc)
            check_ret("acl.media.dvpp_free", acl.media.dvpp_free(dev))
    top1.release()
    model.release()
    dvpp.release()
    check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(stream))
    check_ret("acl.rt.destroy_context", acl.rt.destroy_context(context))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(0))
    check_ret("acl.finalize", acl.finalize())
    np.savez(a.output, **out)


if __name__ == "__main__":
    main()
