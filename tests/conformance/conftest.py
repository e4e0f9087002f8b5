"""EMBER_OPINFO_DYNAMO=1: run the OpInfo samples through torch.compile (Dynamo's capture + our
backend) instead of handing the backend a one-node graph."""
import os

if os.environ.get("EMBER_OPINFO_DYNAMO") == "1":
    import torch
    import torch._dynamo

    from ember.testing import opinfo

    opinfo.use_dynamo(torch.compile, torch._dynamo.reset)
