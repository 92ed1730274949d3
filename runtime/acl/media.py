"""``acl.media``: DVPP media data processing -- DVPP memory, channels, picture / stream descriptors, and the
engines: JPEG decode (JPEGD), JPEG encode (JPEGE), PNG decode (PNGD) and the VPC (resize, crop,
crop-and-paste, batch crops, colour conversion) and the video codecs (VDEC ``vdec_*``, VENC ``venc_*``:
H.264 / H.265).  Calling convention as every acl call (:mod:`runtime.acl._calls`).

Engine calls (``*_async``) check their descriptors on the host and only order the device: the task runs
on ``stream`` after its earlier work, on the device's DVPP engine (priced by its own pixel rate, a
``DVPP`` task in profiles); outputs are there after ``acl.rt.synchronize_stream``.  See
docs/pyacl-media.md.

This module holds the API of ``acl.media`` and nothing else (``dir(acl.media)`` lists exactly it;
tests/reference/pyacl_api.txt); the functions live in :mod:`._media` (memory, descriptors),
:mod:`._media_ops` (engines) and :mod:`._media_video` (VDEC / VENC).
"""
from ._media import (  # noqa: F401 - the API of acl.media
    dvpp_malloc, dvpp_free, dvpp_create_channel_desc, dvpp_destroy_channel_desc, dvpp_create_channel,
    dvpp_destroy_channel, dvpp_set_channel_desc_mode, dvpp_get_channel_desc_channel_id, dvpp_create_pic_desc,
    dvpp_destroy_pic_desc, dvpp_set_pic_desc_data, dvpp_set_pic_desc_size, dvpp_set_pic_desc_format,
    dvpp_set_pic_desc_width, dvpp_set_pic_desc_height, dvpp_set_pic_desc_width_stride,
    dvpp_set_pic_desc_height_stride, dvpp_set_pic_desc_ret_code, dvpp_get_pic_desc_data, dvpp_get_pic_desc_size,
    dvpp_get_pic_desc_format, dvpp_get_pic_desc_width, dvpp_get_pic_desc_height, dvpp_get_pic_desc_width_stride,
    dvpp_get_pic_desc_height_stride, dvpp_get_pic_desc_ret_code, dvpp_create_batch_pic_desc, dvpp_get_pic_desc,
    dvpp_destroy_batch_pic_desc, dvpp_create_roi_config, dvpp_set_roi_config, dvpp_destroy_roi_config,
    dvpp_create_resize_config, dvpp_destroy_resize_config, dvpp_set_resize_config_interpolation,
    dvpp_get_resize_config_interpolation, dvpp_create_jpege_config, dvpp_destroy_jpege_config,
    dvpp_set_jpege_config_level, dvpp_get_jpege_config_level, dvpp_create_stream_desc, dvpp_destroy_stream_desc,
    dvpp_set_stream_desc_data, dvpp_set_stream_desc_size, dvpp_set_stream_desc_format,
    dvpp_set_stream_desc_timestamp, dvpp_set_stream_desc_ret_code, dvpp_set_stream_desc_eos,
    dvpp_get_stream_desc_data, dvpp_get_stream_desc_size, dvpp_get_stream_desc_format,
    dvpp_get_stream_desc_timestamp, dvpp_get_stream_desc_ret_code, dvpp_get_stream_desc_eos,
)
from ._media_ops import (  # noqa: F401 - the API of acl.media
    dvpp_jpeg_get_image_info, dvpp_jpeg_predict_dec_size, dvpp_png_get_image_info, dvpp_png_predict_dec_size,
    dvpp_jpeg_decode_async, dvpp_png_decode_async, dvpp_jpeg_predict_enc_size, dvpp_jpeg_encode_async,
    dvpp_vpc_resize_async, dvpp_vpc_crop_async, dvpp_vpc_crop_and_paste_async, dvpp_vpc_convert_color_async,
    dvpp_vpc_batch_crop_async, dvpp_vpc_batch_crop_and_paste_async,
)
from ._media_video import (  # noqa: F401 - the API of acl.media
    vdec_create_channel_desc, vdec_destroy_channel_desc, vdec_create_channel, vdec_destroy_channel,
    vdec_create_frame_config, vdec_destroy_frame_config, vdec_set_channel_desc_channel_id,
    vdec_set_channel_desc_thread_id, vdec_set_channel_desc_callback, vdec_set_channel_desc_entype,
    vdec_set_channel_desc_out_pic_format, vdec_set_channel_desc_out_mode, vdec_get_channel_desc_out_mode,
    vdec_send_frame, venc_create_channel_desc, venc_destroy_channel_desc, venc_create_channel,
    venc_destroy_channel, venc_create_frame_config, venc_destroy_frame_config, venc_set_channel_desc_thread_id,
    venc_set_channel_desc_callback, venc_set_channel_desc_entype, venc_set_channel_desc_pic_format,
    venc_set_channel_desc_pic_width, venc_set_channel_desc_pic_height, venc_set_channel_desc_key_frame_interval,
    venc_set_frame_config_eos, venc_set_frame_config_force_i_frame, venc_get_frame_config_eos,
    venc_get_frame_config_force_i_frame, venc_send_frame,
)
