"""torchtitan's eager building blocks of late 2024 (9dec370), for the device checks beside it
(imported as cuda_timer is: running `python hardware/measure/NAME.py` puts this folder on
sys.path). torch comes in as an argument, so importing this needs no PyTorch."""

from __future__ import annotations


def rms_norm(torch, nn, hidden: int):
    """The RMSNorm class of torchtitan's models/norms.py in eager mode: the input cast to fp32,
    normalised, cast back and scaled (two fp32 temporaries a call)."""

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            y = x.float()
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)
            return y.type_as(x) * self.weight

    return RMSNorm
