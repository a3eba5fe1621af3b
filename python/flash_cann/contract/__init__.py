"""The op contract, declared once: ``flash_cann_ops.yaml`` (read by ``spec``) states the
ops, their arguments, layouts, limits and which backend has which feature; ``variant``
states what each feature computes; ``checks`` refuses bad input by name for every
backend; ``ops`` registers ``torch.ops.flash_cann`` (schemas, fake kernels, autograd,
plans per signature) and dispatches to the backend the spec names; ``eager`` is the
plain-call shortcut past the dispatcher; ``reference`` is the contract executed densely
in float64 (the oracle, and the S_dmask debug path). Nothing here imports a backend:
``ops`` loads the module the spec names when a device type first needs it."""
