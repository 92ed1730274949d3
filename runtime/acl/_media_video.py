"""The implementation of ``acl.media``'s video codecs, VDEC (``vdec_*``) and VENC (``venc_*``): every call
exists under pyACL's name and is refused.

vnpu has no H.264 / H.265 engine: each call records why and answers ACL_ERROR_API_NOT_SUPPORT (200001)
-- the functions that return ``ret`` return it; the create functions, which return a handle, return 0
(pyACL's failure value); the getters return 0.  Nothing is created, so nothing needs destroying; a
program that checks its return codes stops at ``vdec_create_channel_desc`` / ``venc_create_channel_desc``
with a clear message (``acl.get_recent_err_msg()``).
"""
from __future__ import annotations

from devices.errors import ACL_ERROR_API_NOT_SUPPORT, AclError

from ._calls import acl_call, acl_value

ACL_NAMESPACE = "acl.media"

_WHY = ("vnpu has no video codec engine (VDEC / VENC: H.264 / H.265); decode frames on the host and "
        "use acl.media's picture calls")


def _refuse():
    raise AclError(_WHY, code=ACL_ERROR_API_NOT_SUPPORT)


# ---------------------------------------------------------------------------------------------- VDEC
@acl_value(0)
def vdec_create_channel_desc():
    _refuse()


@acl_call()
def vdec_destroy_channel_desc(channel_desc):
    _refuse()


@acl_call()
def vdec_create_channel(channel_desc):
    _refuse()


@acl_call()
def vdec_destroy_channel(channel_desc):
    _refuse()


@acl_value(0)
def vdec_create_frame_config():
    _refuse()


@acl_call()
def vdec_destroy_frame_config(frame_config):
    _refuse()


@acl_call()
def vdec_set_channel_desc_channel_id(channel_desc, channel_id):
    _refuse()


@acl_call()
def vdec_set_channel_desc_thread_id(channel_desc, thread_id):
    _refuse()


@acl_call()
def vdec_set_channel_desc_callback(channel_desc, callback):
    _refuse()


@acl_call()
def vdec_set_channel_desc_entype(channel_desc, en_type):
    _refuse()


@acl_call()
def vdec_set_channel_desc_out_pic_format(channel_desc, out_pic_format):
    _refuse()


@acl_call()
def vdec_set_channel_desc_out_mode(channel_desc, out_mode):
    _refuse()


@acl_value(0)
def vdec_get_channel_desc_out_mode(channel_desc):
    _refuse()


@acl_call()
def vdec_send_frame(channel_desc, input_stream_desc, output_pic_desc, config, user_data):
    _refuse()


# ---------------------------------------------------------------------------------------------- VENC
@acl_value(0)
def venc_create_channel_desc():
    _refuse()


@acl_call()
def venc_destroy_channel_desc(channel_desc):
    _refuse()


@acl_call()
def venc_create_channel(channel_desc):
    _refuse()


@acl_call()
def venc_destroy_channel(channel_desc):
    _refuse()


@acl_value(0)
def venc_create_frame_config():
    _refuse()


@acl_call()
def venc_destroy_frame_config(frame_config):
    _refuse()


@acl_call()
def venc_set_channel_desc_thread_id(channel_desc, thread_id):
    _refuse()


@acl_call()
def venc_set_channel_desc_callback(channel_desc, callback):
    _refuse()


@acl_call()
def venc_set_channel_desc_entype(channel_desc, en_type):
    _refuse()


@acl_call()
def venc_set_channel_desc_pic_format(channel_desc, pic_format):
    _refuse()


@acl_call()
def venc_set_channel_desc_pic_width(channel_desc, width):
    _refuse()


@acl_call()
def venc_set_channel_desc_pic_height(channel_desc, height):
    _refuse()


@acl_call()
def venc_set_channel_desc_key_frame_interval(channel_desc, key_frame_interval):
    _refuse()


@acl_call()
def venc_set_frame_config_eos(frame_config, eos):
    _refuse()


@acl_call()
def venc_set_frame_config_force_i_frame(frame_config, force_i_frame):
    _refuse()


@acl_value(0)
def venc_get_frame_config_eos(frame_config):
    _refuse()


@acl_value(0)
def venc_get_frame_config_force_i_frame(frame_config):
    _refuse()


@acl_call()
def venc_send_frame(channel_desc, input_pic_desc, reserve, config, user_data):
    _refuse()
