"""flash-cann inside other libraries' plug-in points: ``transformers`` (the "fa_cann"
attention implementation, registered when transformers' modeling code is imported, via
``post_import``; never imports transformers eagerly), ``flash_attn_alias`` (``import
flash_attn`` served by flash_cann, on request) and ``torchair`` (GE converters,
registered when torchair is really imported; never imports it eagerly). Nothing in
flash_cann imports these but the package's face."""
