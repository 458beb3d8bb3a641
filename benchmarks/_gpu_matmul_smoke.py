import traceback, numpy as np, torch, nvdispatch
from nvdispatch import Epilog
a = torch.randn(64, 32, device="cuda"); b = torch.randn(32, 48, device="cuda"); bias = torch.randn(48, device="cuda")
for ep, inp in [("RELU_BIAS", {"bias": bias}), ("BIAS", {"bias": torch.randn(64, 1, device="cuda")}), ("RELU_AUX", None), ("GELU_AUX_BIAS", {"bias": bias}), ("BGRADA", None), ("BGRADB", None), ("DRELU", {"relu_aux": torch.rand(64, 48, device="cuda") > 0.5}), ("DGELU_BGRAD", {"gelu_aux": torch.randn(64, 48, device="cuda")})]:
    try:
        print(nvdispatch.explain(a, b, epilog=ep, epilog_inputs=inp))
        r = nvdispatch.matmul(a, b, epilog=ep, epilog_inputs=inp)
        torch.cuda.synchronize()
        print("  ok", type(r))
    except Exception:
        traceback.print_exc()
from nvdispatch._cuda import cublaslt
print("cublasLt version", cublaslt.version())
