"""Every coefficient of the analytical model, declared once: its name, unit, meaning, default per engine with where
that default comes from, the range a fitted value may take, how it enters the model (as itself or, for an
efficiency, as its inverse), the fitted quantities it is a term of, and the devices and engines it acts on.

:mod:`predictor.coefficients` (defaults, tables), :mod:`calibration.fit` (bounds), :mod:`calibration.features`
(terms), :mod:`calibration.output` (units) and :mod:`benchcal.reports.predictions` (where a coefficient is shown) all read
this registry. Every coefficient is physical, so a fitted table can be read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from predictor.devices import KINDS
from predictor.engines import ENGINES


@dataclass(frozen=True)
class Coefficient:
    """One coefficient. ``bounds`` None: never fitted (a default only); ``inverse``: enters the model as
    1 / value (an efficiency); ``kinds`` / ``engines``: where it acts in a prediction; ``in_predictions`` False:
    it describes old engine builds only (fitted from their runs, never in a prediction)."""

    name: str
    unit: str
    meaning: str
    defaults: Mapping[str, tuple[float, str]]
    bounds: tuple[float, float] | None = None
    cpu_upper: float | None = None
    inverse: bool = False
    kinds: tuple[str, ...] = KINDS
    engines: tuple[str, ...] = ENGINES
    in_predictions: bool = True

    def acts(self, engine: str, kind: str) -> bool:
        """True where the coefficient enters a prediction for ``engine`` on a device of ``kind``."""
        return self.in_predictions and engine in self.engines and kind in self.kinds


# Sources shared by several defaults.
_CALC = 'uncalibrated: a constant share of peak bandwidth, as public VRAM calculators assume (0.65-0.87)'
_KV = 'uncalibrated: the same share of peak bandwidth as the weights (calculators do not separate the two)'
_REREAD = "uncalibrated: every re-read of a K/V row by another query head of its group reaches DRAM, at the KV read's default share of peak bandwidth (1 / 0.75)"
_DEQUANT = 'uncalibrated: decode is taken as purely bandwidth bound, as the public calculators assume'
_GENERIC = 'uncalibrated: every CPU matmul format taken at one compute efficiency'
_UNPACK = 'not fitted engine-wide: prefill on a unified-memory GPU is taken as purely matmul bound unless its device or family was measured'
_SAMPLER = ("tests/data/vllm/llm-d/: vLLM's logged peak activation on an H100 at its default 1,024 sequences "
            "(llm-d's summaries: Qwen3-0.6B 5.56 GiB, Llama-3.1-8B 4.76, Qwen3-32B 5.64), the sampler's warm-up "
            "after the forward pass (larger than the forward of 8,192 tokens in all three): less the 8,192 hidden "
            "states it still holds, over one f32 logits buffer (1,024 x vocabulary x 4 bytes): 9.57, 9.60 and 9.60 "
            "buffers, the median 9.60 less the logits themselves; none with FlashInfer's sort-free sampler, which "
            "the A100 80GB logs of tests/data/imported/vllm-logs/ name")
_VISIBLE = ("tests/data/imported/vllm-logs/ and tests/data/vllm/llm-d/: the total vLLM logged over the catalogue's "
            "memory: T4 14.74 / 15 GiB, "
            "RTX 3090 23.58 / 24, H100 SXM 79.18 / 79.65 (0.983, 0.983, 0.994); the median")
_SCORES = ('physics: each score moves 26 bytes at peak bandwidth (llama.cpp without flash attention: the KQ product '
           'written in FP16 and converted to F32, read with the mask by the softmax and written, converted to FP16 '
           'for the KQV product and read by it), 4 / 26 of the 4-byte write the term counts')
_F16 = "uncalibrated: the host matmul probe is llama.cpp's own F16 prefill (harness.hostbench), so F16 weights run at its rate"
_DESIGN = 'uncalibrated: a CUDA context and allocator pools take about 100-600 MiB depending on the GPU'

_COEFFICIENTS: tuple[Coefficient, ...] = (
    Coefficient(
        name="decode_fixed_ms",
        unit="ms",
        meaning='fixed time per decode step, ms (sampling, graph launch, host sync)',
        defaults={
            "llama.cpp": (0.0, 'uncalibrated: no fixed term, as the public calculators assume'),
            "vllm": (0.0, 'uncalibrated: no fixed term, as the public calculators assume'),
        },
        bounds=(0.0, 1000.0),
    ),
    Coefficient(
        name="decode_fixed_per_layer_us",
        unit="us/layer",
        meaning='fixed time per decode step per layer, microseconds (kernel launches)',
        defaults={
            "llama.cpp": (0.0, 'uncalibrated: no per-layer term, as the public calculators assume'),
            "vllm": (0.0, 'uncalibrated: no per-layer term'),
        },
        bounds=(0.0, 10000.0),
    ),
    Coefficient(
        name="decode_moe_per_layer_us",
        unit="us/MoE layer",
        meaning='fixed time per decode step per mixture-of-experts layer beyond a dense layer\'s, microseconds: the router matmul, its softmax and top-k selection, the expert matmuls by id (mul_mat_id) and the weighted sum of their outputs are more kernels, each with its launch and synchronisation, than a dense MLP',
        defaults={
            "llama.cpp": (0.0, 'uncalibrated: an MoE layer is timed as a dense one, as the public calculators assume'),
            "vllm": (0.0, 'uncalibrated: an MoE layer is timed as a dense one'),
        },
        bounds=(0.0, 10000.0),
    ),
    Coefficient(
        name="decode_bw_efficiency",
        unit="of peak BW",
        meaning='achieved / peak memory bandwidth while streaming the weights, 0-1',
        defaults={
            "llama.cpp": (0.75, _CALC + '; midpoint'),
            "vllm": (0.75, _CALC + '; midpoint'),
        },
        bounds=(0.02, 1.0),
        cpu_upper=2.0,
        inverse=True,
    ),
    Coefficient(
        name="decode_kv_efficiency",
        unit="of peak BW",
        meaning='achieved / peak memory bandwidth while attention reads the KV cache once, 0-1',
        defaults={
            "llama.cpp": (0.75, _KV),
            "vllm": (0.75, _KV),
        },
        bounds=(0.02, 1.0),
        inverse=True,
    ),
    Coefficient(
        name="decode_kv_reread",
        unit="peak-BW bytes per byte",
        meaning="cost of each further read of a cached K/V row by another query head of its group (llama.cpp without flash attention), in peak-bandwidth bytes per byte: 1 / the KV efficiency when every re-read comes from DRAM, less where the GPU's cache holds the rows between the query heads (0-50)",
        defaults={
            "llama.cpp": (1.3333333333333333, _REREAD),
            "vllm": (1.3333333333333333, _REREAD),
        },
        bounds=(0.0, 50.0),
    ),
    Coefficient(
        name="decode_dequant_flops_per_byte",
        unit="ops per quantized byte",
        meaning="operations per byte of quantized weights unpacked in a decode step, at the device's peak FLOPS (unified-memory GPUs: Apple's ALUs run near their bandwidth limit; the CPU: its measured FP32 rate)",
        defaults={
            "llama.cpp": (0.0, _DEQUANT),
            "vllm": (0.0, _DEQUANT),
        },
        bounds=(0.0, 1000.0),
        kinds=('unified', 'cpu'),
    ),
    Coefficient(
        name="decode_kquant_flops_per_weight",
        unit="ops per weight",
        meaning="a discrete GPU's decode kernels that unpack weights on its ALUs: operations per weight in a decode step, at the device's peak FLOPS (llama.cpp: its matrix-vector kernels on the low-bit K-quants, Q2_K and Q3_K tensors; vLLM: the AWQ GEMM kernel of versions before awq_marlin, 0.5.3, on every layer weight: predictor/data/engine_eras.json unpacking_kernels)",
        defaults={
            "llama.cpp": (0.0, _DEQUANT),
            "vllm": (0.0, 'uncalibrated: Marlin streams AWQ/GPTQ weights at their bytes; 0 until runs of the AWQ GEMM kernel are fitted'),
        },
        bounds=(0.0, 1000.0),
        kinds=('gpu',),
        engines=('llama.cpp', 'vllm'),
    ),
    Coefficient(
        name="decode_generic_flops_per_byte",
        unit="ops per quantized byte",
        meaning='llama.cpp on a CPU: operations more per quantized byte on its generic dot products (Q5_0, Q6_K, ...: neither repacked nor Q8_0), at the probed matmul rate',
        defaults={
            "llama.cpp": (0.0, _DEQUANT),
            "vllm": (0.0, 'not used by vLLM'),
        },
        bounds=(0.0, 1000.0),
        kinds=('cpu',),
    ),
    Coefficient(
        name="prefill_fixed_ms",
        unit="ms",
        meaning='fixed time per prompt, ms',
        defaults={
            "llama.cpp": (0.0, 'uncalibrated: no fixed term'),
            "vllm": (0.0, 'uncalibrated: no fixed term'),
        },
        bounds=(0.0, 10000.0),
    ),
    Coefficient(
        name="prefill_dequant_bytes_per_weight",
        unit="bytes per weight",
        meaning='device-memory traffic per quantized weight per ubatch when an old llama.cpp CUDA build dequantizes the weights to an FP16 buffer for cuBLAS (read quantized, write FP16, ...), bytes at peak bandwidth; current builds (MMQ) do not',
        defaults={
            "llama.cpp": (4.0, 'physics: the FP16 copy of each weight written (2 bytes) and read back by the cuBLAS '
                               'GEMM (2 bytes); ggml_cuda_op_mul_mat_cublas converts src0 with to_fp16_cuda into a pool '
                               'buffer before cublasGemmEx'),
            "vllm": (0.0, 'not used by vLLM'),
        },
        bounds=(0.0, 100.0),
        in_predictions=False,
    ),
    Coefficient(
        name="prefill_unpack_flops_per_weight",
        unit="ops per weight",
        meaning='operations per quantized weight and prompt token a unified-memory GPU spends unpacking weight tiles in its matmul kernels (Metal), at peak FLOPS; fitted per device and family only',
        defaults={
            "llama.cpp": (0.0, _UNPACK),
            "vllm": (0.0, _UNPACK),
        },
        bounds=(0.0, 1000.0),
        kinds=('unified',),
    ),
    Coefficient(
        name="prefill_generic_flops_per_weight",
        unit="ops per weight",
        meaning="operations per weight and prompt token llama.cpp's generic CPU matmul path (quantized formats it does not repack into its GEMM layouts: Q5_0, Q6_K, ...) spends beyond the repacked kernels' rate, at the probed matmul rate; CPU only",
        defaults={
            "llama.cpp": (0.0, _GENERIC),
            "vllm": (0.0, _GENERIC),
        },
        bounds=(0.0, 1000.0),
        kinds=('cpu',),
    ),
    Coefficient(
        name="prefill_q8_flops_per_weight",
        unit="ops per weight",
        meaning='the same for Q8_0 weights, whose dot product unpacks no sub-block scales; CPU only',
        defaults={
            "llama.cpp": (0.0, _GENERIC),
            "vllm": (0.0, _GENERIC),
        },
        bounds=(0.0, 1000.0),
        kinds=('cpu',),
    ),
    Coefficient(
        name="prefill_expert_vecdot_flops_per_weight",
        unit="ops per weight",
        meaning="the same for a mixture of experts' routed expert weights in F16/BF16/F32, which llama.cpp's CPU backend multiplies in mul_mat_id's row-by-column dot products (ggml-cpu.c: llamafile's GEMM serves mul_mat only; the repacked formats have their own mul_mat_id); CPU only",
        defaults={
            "llama.cpp": (0.0, _GENERIC),
            "vllm": (0.0, _GENERIC),
        },
        bounds=(0.0, 1000.0),
        kinds=('cpu',),
        engines=('llama.cpp',),
    ),
    Coefficient(
        name="prefill_compute_efficiency",
        unit="of peak FLOPS",
        meaning='achieved / peak dense FP16 FLOPS for the weight matmuls, 0-1 (CPU: of the probed matmul rate, for the repacked and generic paths)',
        defaults={
            "llama.cpp": (0.4, 'uncalibrated: a typical share of dense tensor peak for quantized matmuls'),
            "vllm": (0.5, 'uncalibrated: a typical share of dense tensor peak for FP16 GEMMs'),
        },
        bounds=(0.005, 2.0),
        cpu_upper=4.0,
        inverse=True,
    ),
    Coefficient(
        name="prefill_f16_efficiency",
        unit="of probed CPU FLOPS",
        meaning="llama.cpp on a CPU: achieved / probed matmul rate for F16/BF16/F32 weights (llamafile's GEMM, the path the probe itself runs: near 1)",
        defaults={
            "llama.cpp": (1.0, _F16),
            "vllm": (1.0, 'not used by vLLM'),
        },
        bounds=(0.005, 4.0),
        inverse=True,
        kinds=('cpu',),
    ),
    Coefficient(
        name="prefill_attn_efficiency",
        unit="of peak FLOPS",
        meaning='achieved / peak FLOPS for attention (grows with n^2), 0-1 (flash attention, vLLM)',
        defaults={
            "llama.cpp": (0.4, 'uncalibrated: same as the matmul efficiency'),
            "vllm": (0.5, 'uncalibrated: same as the matmul efficiency'),
        },
        bounds=(0.005, 1.0),
        cpu_upper=4.0,
        inverse=True,
    ),
    Coefficient(
        name="prefill_scores_efficiency",
        unit="of peak BW",
        meaning='achieved / peak bandwidth writing the f32 attention scores once, 0-1 (llama.cpp without flash attention: the scores go through memory several times)',
        defaults={
            "llama.cpp": (0.154, _SCORES),
            "vllm": (0.154, _SCORES),
        },
        bounds=(0.005, 1.0),
        inverse=True,
    ),
    Coefficient(
        name="runtime_fixed_gib",
        unit="GiB",
        meaning='engine + driver context (CUDA context, allocator pools, interpreter on CPU), GiB',
        defaults={
            "llama.cpp": (0.35, _DESIGN + '; midpoint'),
            "vllm": (0.5, _DESIGN + '; upper half (torch + CUDA context)'),
        },
        bounds=(0.0, 64.0),
    ),
    Coefficient(
        name="compute_buffer_scale",
        unit="x analytical",
        meaning='multiplier on the analytical activation/compute buffer, dimensionless',
        defaults={
            "llama.cpp": (1.0, "analytical buffer sizes of llama.cpp's graph (logits, FFN, attention scores)"),
            "vllm": (1.0, "analytical activation peak of vLLM's profile run"),
        },
        bounds=(0.0, 20.0),
    ),
    Coefficient(
        name="reserve_gib",
        unit="GiB",
        meaning='device memory kept free for driver/display/OS, GiB (discrete GPUs)',
        defaults={
            "llama.cpp": (0.5, 'uncalibrated: driver/display reserve on a discrete GPU'),
            "vllm": (0.5, 'uncalibrated: driver/display reserve on a discrete GPU'),
        },
    ),
    Coefficient(
        name="host_bw_efficiency",
        unit="of host BW",
        meaning='achieved / peak host bandwidth for layers offloaded to the host, 0-1',
        defaults={
            "llama.cpp": (0.6, 'uncalibrated: share of peak DDR bandwidth reached by CPU matmul-vec'),
            "vllm": (0.6, 'uncalibrated: share of peak DDR bandwidth'),
        },
        bounds=(0.02, 2.0),
        inverse=True,
    ),
    Coefficient(
        name="pcie_gbs",
        unit="GB/s",
        meaning='host-to-device bandwidth used when offloaded weights are streamed for prefill, GB/s',
        defaults={
            "llama.cpp": (25.0, 'PCIe 4.0 x16 practical host-to-device rate (32 GB/s theoretical)'),
            "vllm": (25.0, 'PCIe 4.0 x16 practical host-to-device rate (32 GB/s theoretical)'),
        },
    ),
    Coefficient(
        name="tp_allreduce_us",
        unit="us",
        meaning='latency of one tensor-parallel all-reduce, microseconds',
        defaults={
            "llama.cpp": (20.0, 'uncalibrated: PCIe all-reduce latency'),
            "vllm": (20.0, 'uncalibrated: PCIe all-reduce latency'),
        },
    ),
    Coefficient(
        name="vllm_graph_gib",
        unit="GiB",
        meaning='vLLM CUDA-graph pool and non-torch allocations, GiB',
        defaults={
            "llama.cpp": (0.0, 'not used by llama.cpp'),
            "vllm": (0.5, "uncalibrated: vLLM logs 'Graph capturing finished ... took 0.3-1 GiB'"),
        },
        engines=("vllm",),
    ),
    Coefficient(
        name="vllm_non_torch_gib",
        unit="GiB",
        meaning='vLLM CUDA-graph pool and non-torch allocations, GiB',
        defaults={
            "llama.cpp": (0.0, 'not used by llama.cpp'),
            "vllm": (0.3, "uncalibrated: vLLM's non_torch_memory line, a few hundred MiB"),
        },
        engines=("vllm",),
    ),
    Coefficient(
        name="vllm_sampler_copies",
        unit="x logits",
        meaning="vLLM on a GPU: the logits-sized buffers its sampler's warm-up adds to the profile run's peak beyond "
                "the logits themselves (top-k/top-p sorts the max_num_seqs x vocabulary logits), which the KV pool "
                "is net of",
        defaults={
            "llama.cpp": (0.0, 'not used by llama.cpp'),
            "vllm": (8.6, _SAMPLER),
        },
        kinds=("gpu",),
        engines=("vllm",),
    ),
    Coefficient(
        name="vllm_visible_memory_share",
        unit="x memory",
        meaning="vLLM on a GPU: the share of the device's memory the CUDA driver reports as its total, which "
                "gpu_memory_utilization is a fraction of",
        defaults={
            "llama.cpp": (1.0, 'not used by llama.cpp'),
            "vllm": (0.983, _VISIBLE),
        },
        kinds=("gpu",),
        engines=("vllm",),
    ),
    Coefficient(
        name="vllm_cpu_worker_gib",
        unit="GiB",
        meaning="vLLM on a CPU: what its worker process holds beyond the weights once warmed up (interpreter, torch, "
                "its kernels' buffers), which the KV pool it reserves is net of; per host, the median of its "
                "profiled runs' logged non-kv usage minus their weights",
        defaults={
            "llama.cpp": (0.0, 'not used by llama.cpp'),
            "vllm": (0.71, 'tests/data/vllm/kv-pool/: three profiled vllm-cpu 0.32.0 runs (SmolLM2-135M, Qwen2.5-0.5B, '
                           'Llama-3.2-1B) on a 2-core AMD EPYC host, the logged non-kv usage less the weights 0.709-0.728 '
                           'GiB (tests/data/vllm/cpu_profiled_ok.log, an earlier session: 0.81)'),
        },
        kinds=("cpu",),
        engines=("vllm",),
    ),
)

REGISTRY: dict[str, Coefficient] = {c.name: c for c in _COEFFICIENTS}
COEFFICIENT_NAMES: tuple[str, ...] = tuple(REGISTRY)
# The fitted terms of each quantity, in the order of the fit's design columns (calibration.features).
FIT_TERMS: dict[str, tuple[str, ...]] = {
    "decode": ('decode_fixed_ms', 'decode_fixed_per_layer_us', 'decode_bw_efficiency', 'decode_kv_efficiency', 'decode_kv_reread', 'decode_moe_per_layer_us', 'decode_dequant_flops_per_byte', 'decode_generic_flops_per_byte', 'decode_kquant_flops_per_weight', 'host_bw_efficiency'),
    "prefill": ('prefill_fixed_ms', 'decode_bw_efficiency', 'prefill_compute_efficiency', 'prefill_f16_efficiency', 'prefill_attn_efficiency', 'prefill_scores_efficiency', 'prefill_dequant_bytes_per_weight', 'prefill_unpack_flops_per_weight', 'prefill_generic_flops_per_weight', 'prefill_q8_flops_per_weight', 'prefill_expert_vecdot_flops_per_weight'),
    "memory": ('runtime_fixed_gib', 'compute_buffer_scale'),
}
# Uncalibrated defaults per engine: (value, where it comes from); calibration replaces them.
ENGINE_DEFAULTS: dict[str, dict[str, tuple[float, str]]] = {
    engine: {c.name: c.defaults[engine] for c in _COEFFICIENTS} for engine in ENGINES
}
