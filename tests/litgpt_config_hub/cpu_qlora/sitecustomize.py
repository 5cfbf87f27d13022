"""QLoRA on CPU, for tests/test_config_hub.py only: this folder is put on ``PYTHONPATH`` of the ``litgpt`` runs of the
hub's ``qlora.yaml`` recipes (both ``--liger true`` and ``--liger false``), so Python imports this file at start-up.

litgpt's ``--quantize bnb.*`` hands Fabric Lightning's ``BitsandbytesPrecision``, and Lightning allows it on CUDA only
(any precision): ``lightning.fabric.connector._Connector._check_and_init_precision`` raises "Bitsandbytes is only
supported on CUDA GPUs." and ``_Linear4bit.quantize`` raises "Unexpected device type: cpu". bitsandbytes itself
(>= 0.45) quantizes and multiplies 4-bit weights on CPU (tests/test_qlora.py does). What changes here: those two
checks are lifted; a layer made on the CPU is quantized when made, as Lightning does for one made on a CUDA device; and
bitsandbytes' CPU-only inference repacking stays off (see ``_init_quantized``). The layers are Lightning's own
``_NF4Linear`` etc., quantized again by Lightning's own load hook from the checkpoint's weight cast to float16, as on
CUDA. (It takes the place of any other ``sitecustomize`` module for these runs only.)
"""

import os

if os.environ.get("LIT_LIGER_TEST_CPU_QLORA") == "1":
    import torch
    from lightning.fabric import connector
    from lightning.fabric.plugins import BitsandbytesPrecision
    from lightning.fabric.plugins.precision import bitsandbytes as _bnb_precision

    bnb = _bnb_precision._import_bitsandbytes()  # (defines Lightning's _Linear4bit classes)
    _check = connector._Connector._check_and_init_precision

    def _check_and_init_precision(self):
        if isinstance(self._precision_instance, BitsandbytesPrecision):
            return self._precision_instance  # (Lightning: CUDAAccelerator only)
        return _check(self)

    def _quantize(params4bit, weight, device):
        # Lightning's _Linear4bit.quantize, its `device.type != "cuda"` check left out
        device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        w = weight.contiguous().to(device=device, dtype=torch.half)
        w_4bit, quant_state = bnb.functional.quantize_4bit(
            w,
            blocksize=params4bit.blocksize,
            compress_statistics=params4bit.compress_statistics,
            quant_type=params4bit.quant_type,
            quant_storage=params4bit.quant_storage,
        )
        return _bnb_precision._replace_param(params4bit, w_4bit, quant_state)

    _init = _bnb_precision._Linear4bit.__init__

    def _init_quantized(self, *args, device=None, **kwargs):
        # Lightning quantizes a layer made under a CUDA device here (litgpt counts the parameters before it loads the
        # checkpoint); on CPU too now
        _init(self, *args, device=device, **kwargs)
        # bitsandbytes repacks a CPU layer's weight for its AVX512-BF16 kernel at the first forward in eval mode
        # without grad, and from then on multiplies with that kernel: which layers it repacks would depend on which
        # ones a run's validation calls (lit-liger's fused validation loss reads the lm_head's weight, not its
        # forward), so the two runs would differ by that kernel's rounding. Both keep the decode-and-matmul path.
        self.support_avx512bf16_for_cpu = False
        if self.weight.device.type == "cpu":
            self.quantize_()

    connector._Connector._check_and_init_precision = _check_and_init_precision
    _bnb_precision._Linear4bit.quantize = staticmethod(_quantize)
    _bnb_precision._Linear4bit.__init__ = _init_quantized
