"""A single-operator program in the style of the public pyACL samples (acl.op).

Written for real NPUs: it only talks to ``acl``.  tests/core/test_acl_op.py runs it on vnpu after changing
its ``import acl`` line and nothing else, with operator models compiled by ``vnpu atc --singleop`` from
tests/samples/acl_op_list.json.  The flow is the samples' one: init, set device, create a context and a
stream, point ``acl.op.set_model_dir`` at the compiled operators, then

- ``Add`` of two int32 matrices by ``acl.op.execute_v2`` (no attributes);
- a classifier's tail: ``acl.op.cast`` of float32 scores to float16, then ``ArgMaxV2`` whose second input
  (the dimension) is a constant set with ``acl.set_tensor_const`` and passed as a null data buffer;
- ``BatchMatMul`` with ``adj_x2`` set, matched once by ``acl.op.create_handle`` and run twice by
  ``acl.op.execute_with_handle``;

and copy each result out through pinned host memory, destroying everything in the reverse order.

    python acl_op_sample.py --model-dir op_models --inputs in.npz --output out.npz
"""
import argparse

import numpy as np
import acl

# the samples define the constants they use themselves (constant.py)
ACL_SUCCESS = 0
ACL_MEM_MALLOC_NORMAL_ONLY = 2
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_FLOAT, ACL_FLOAT16, ACL_INT32 = 0, 1, 3
ACL_FORMAT_ND = 2
ACL_DTYPE = {"float32": ACL_FLOAT, "float16": ACL_FLOAT16, "int32": ACL_INT32}


def check_ret(message, ret):
    if ret != ACL_SUCCESS:
        raise Exception("{} failed ret={}: {}".format(message, ret, acl.get_recent_err_msg()))


class SingleOps:
    def __init__(self, device_id, model_dir):
        self.device_id = device_id
        self.model_dir = model_dir
        self.allocs, self.buffers, self.descs = [], [], []

    def init_resource(self):
        check_ret("acl.init", acl.init())
        check_ret("acl.rt.set_device", acl.rt.set_device(self.device_id))
        self.context, ret = acl.rt.create_context(self.device_id)
        check_ret("acl.rt.create_context", ret)
        self.stream, ret = acl.rt.create_stream()
        check_ret("acl.rt.create_stream", ret)
        check_ret("acl.op.set_model_dir", acl.op.set_model_dir(self.model_dir))

    def desc(self, dtype, shape):
        d = acl.create_tensor_desc(ACL_DTYPE[dtype], list(shape), ACL_FORMAT_ND)
        self.descs.append(d)
        return d

    def device_buffer(self, desc, array=None):
        size = acl.get_tensor_desc_size(desc)
        ptr, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_NORMAL_ONLY)
        check_ret("acl.rt.malloc", ret)
        self.allocs.append(ptr)
        if array is not None:
            data = np.ascontiguousarray(array).tobytes()
            check_ret("acl.rt.memcpy", acl.rt.memcpy(ptr, size, acl.util.bytes_to_ptr(data), size,
                                                     ACL_MEMCPY_HOST_TO_DEVICE))
        buf = acl.create_data_buffer(ptr, size)
        self.buffers.append(buf)
        return buf

    def read(self, buf, dtype, shape):
        ptr, size = acl.get_data_buffer_addr(buf), acl.get_data_buffer_size_v2(buf)
        host, ret = acl.rt.malloc_host(size)
        check_ret("acl.rt.malloc_host", ret)
        check_ret("acl.rt.memcpy", acl.rt.memcpy(host, size, ptr, size, ACL_MEMCPY_DEVICE_TO_HOST))
        out = np.frombuffer(acl.util.ptr_to_bytes(host, size), dtype=dtype).reshape(shape).copy()
        check_ret("acl.rt.free_host", acl.rt.free_host(host))
        return out

    def add(self, a, b):
        da, db, dy = self.desc("int32", a.shape), self.desc("int32", b.shape), self.desc("int32", a.shape)
        attr = acl.op.create_attr()
        y = self.device_buffer(dy)
        check_ret("acl.op.execute_v2", acl.op.execute_v2("Add", [da, db], [self.device_buffer(da, a),
                                                                         self.device_buffer(db, b)],
                                                         [dy], [y], attr, self.stream))
        check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        acl.op.destroy_attr(attr)
        return self.read(y, np.int32, a.shape)

    def top1(self, scores):
        n = scores.shape[0]
        d32, d16 = self.desc("float32", [n]), self.desc("float16", [n])
        half = self.device_buffer(d16)
        check_ret("acl.op.cast", acl.op.cast(d32, self.device_buffer(d32, scores), d16, half, 0, self.stream))
        dim = self.desc("int32", [1])
        zero = bytes(acl.data_type_size(ACL_INT32))
        check_ret("acl.set_tensor_const", acl.set_tensor_const(dim, acl.util.bytes_to_ptr(zero), len(zero)))
        dl = self.desc("int32", [1])
        label = self.device_buffer(dl)
        const_buf = acl.create_data_buffer(0, 0)
        attr = acl.op.create_attr()
        check_ret("acl.op.execute_v2", acl.op.execute_v2("ArgMaxV2", [d16, dim], [half, const_buf], [dl], [label],
                                                         attr, self.stream))
        check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
        acl.op.destroy_attr(attr)
        check_ret("acl.destroy_data_buffer", acl.destroy_data_buffer(const_buf))
        return self.read(half, np.float16, [n]), self.read(label, np.int32, [1])

    def batch_matmul_adj_x2(self, x1s, x2s):
        b, m, k = x1s[0].shape
        n = x2s[0].shape[1]
        d1, d2, dy = self.desc("float32", [b, m, k]), self.desc("float32", [b, n, k]), self.desc("float32", [b, m, n])
        attr = acl.op.create_attr()
        check_ret("acl.op.set_attr_bool", acl.op.set_attr_bool(attr, "adj_x1", False))
        check_ret("acl.op.set_attr_bool", acl.op.set_attr_bool(attr, "adj_x2", True))
        handle, ret = acl.op.create_handle("BatchMatMul", [d1, d2], [dy], attr)
        check_ret("acl.op.create_handle", ret)
        outs = []
        for x1, x2 in zip(x1s, x2s):
            y = self.device_buffer(dy)
            check_ret("acl.op.execute_with_handle",
                      acl.op.execute_with_handle(handle, [self.device_buffer(d1, x1), self.device_buffer(d2, x2)],
                                                 [y], self.stream))
            check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(self.stream))
            outs.append(self.read(y, np.float32, [b, m, n]))
        acl.op.destroy_handle(handle)
        acl.op.destroy_attr(attr)
        return np.stack(outs)

    def release(self):
        for buf in self.buffers:
            check_ret("acl.destroy_data_buffer", acl.destroy_data_buffer(buf))
        for ptr in self.allocs:
            check_ret("acl.rt.free", acl.rt.free(ptr))
        for d in self.descs:
            acl.destroy_tensor_desc(d)
        check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(self.stream))
        check_ret("acl.rt.destroy_context", acl.rt.destroy_context(self.context))
        check_ret("acl.rt.reset_device", acl.rt.reset_device(self.device_id))
        check_ret("acl.finalize", acl.finalize())


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", required=True)
    p.add_argument("--inputs", required=True)
    p.add_argument("--output", required=True)
    a = p.parse_args()
    feeds = np.load(a.inputs)
    ops = SingleOps(0, a.model_dir)
    ops.init_resource()
    try:
        out = {"add": ops.add(feeds["a"], feeds["b"])}
        out["half"], out["label"] = ops.top1(feeds["scores"])
        out["bmm"] = ops.batch_matmul_adj_x2([feeds["x1"], feeds["x1_2"]], [feeds["x2"], feeds["x2_2"]])
        print("[SingleOp] label of classification result is:{}".format(out["label"][0]))
    finally:
        ops.release()
    np.savez(a.output, **out)


if __name__ == "__main__":
    main()
