"""The loop IR, shared by lower, schedule and codegen: what a kernel body is made of.

  ops.py      the op vocabulary (`ops`, `set_handler`, `OpsHandler`), dtype rule
  index.py    sympy index functions and helpers, size symbols and their hints
  nodes.py    the buffer and body node classes lower produces
  plan.py     the schedule's result: steps (kernels, externs), dependencies, memory plan
  printer.py  every body and plan as readable Python with a header

Stages import the IR from here, never from each other (tests/test_layering.py).
See docs/design/025-loop-ir.md.
"""
