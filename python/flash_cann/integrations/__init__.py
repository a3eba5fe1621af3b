"""flash-cann inside other libraries' plug-in points: ``transformers`` (an attention
implementation, imported on request: it imports transformers) and ``torchair`` (GE
converters, registered when torchair is really imported; never imports it eagerly).
Nothing in flash_cann imports these but the package's face."""
