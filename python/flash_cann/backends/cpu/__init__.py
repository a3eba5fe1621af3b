"""The ``cpu`` backend: FlashAttention-2 in PyTorch tensor ops (``attention.py``), every
feature of the contract, forward and backward; also the readable statement the other
backends are compared with."""
