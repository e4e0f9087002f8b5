"""Two instances of one class compiled for different backends must not share compiled code."""
import torch

import ember


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


def test_same_class_different_backends_get_their_own_graphs():
    seen = {"a": 0, "b": 0}

    def make(tag):
        def backend(gm, example_inputs):
            seen[tag] += 1
            return gm.forward
        return backend

    a, b = Net(), Net()
    ember.compile(a, backend=make("a"))
    ember.compile(b, backend=make("b"))
    x = torch.randn(2, 4)
    torch.testing.assert_close(a(x), torch.relu(a.lin(x)))
    torch.testing.assert_close(b(x), torch.relu(b.lin(x)))
    assert seen == {"a": 1, "b": 1}
