"""Unit conversions. Inside the package everything is SI (bytes, seconds, FLOP/s, bytes/s);
spec files and reports carry units in their key names and are converted here, once."""

GIB = 1024**3
GB = 1e9
TERA = 1e12
US = 1e-6


def gib_to_bytes(gib: float) -> float:
    return gib * GIB


def bytes_to_gib(n_bytes: float) -> float:
    return n_bytes / GIB


def GBps_to_Bps(GBps: float) -> float:
    return GBps * GB


def tflops_to_flops(tflops: float) -> float:
    return tflops * TERA


def us_to_s(us: float) -> float:
    return us * US


def round_sig(x: float, digits: int = 6) -> float:
    """Round to `digits` significant digits (plan files are byte-stable with it)."""
    if x == 0 or x != x or x in (float("inf"), float("-inf")):
        return float(x)
    return float(f"{x:.{digits - 1}e}")
