"""User tooling on top of the package: the ``flash-cann`` CLI (``cli``), the demo, the
accuracy and memory probes and timing helpers. Nothing in flash_cann imports these."""
