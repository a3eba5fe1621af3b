"""The Ascend CANN package's host side, as the Python package sees it: the native
host-only build of the planner and the twin (``native``), the tiling planner's bindings
(``planner``) and reports (``plan_report``), and the contract header generated from the
op spec for op_host/op_kernel (``contract_header``). Imports the contract only."""
