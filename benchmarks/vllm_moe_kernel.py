"""vLLM's own Triton MoE kernel (`fused_moe_kernel`), read at run time from an installed vLLM's
vllm/model_executor/layers/fused_moe/fused_moe.py and launched as vLLM launches it for unquantized (BF16) experts:
gate-up over the tokens sorted by expert, SiLU-and-multiply, down with the routing weights applied, the sum over
each token's experts. The tile configuration is vLLM's tuned one for the GPU and shape where vLLM ships it
(configs/ beside that file), else vLLM's default rule for BF16. Needs PyTorch and Triton; used by gpu_kernels.py.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import tempfile
from pathlib import Path
from types import ModuleType

import torch
from torch.nn import functional

KERNELS = ("write_zeros_to_output", "fused_moe_kernel")


def load(fused_moe_py: Path) -> ModuleType:
    """The kernel functions alone (they need only Triton), written to a module of their own and imported."""
    source = fused_moe_py.read_text()
    lines = source.splitlines()
    parts = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in KERNELS:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            parts.append("\n".join(lines[start:node.end_lineno]))
    if len(parts) != len(KERNELS):
        raise ValueError(f"{fused_moe_py}: not all of {', '.join(KERNELS)} found")
    folder = Path(tempfile.mkdtemp(prefix="vllm-moe-"))
    module_path = folder / "vllm_fused_moe_kernel.py"
    module_path.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location("vllm_fused_moe_kernel", module_path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def config(fused_moe_py: Path, device_name: str, experts: int, width: int, tokens: int) -> tuple[dict[str, int], str]:
    """vLLM's tile configuration for `tokens` tokens: its tuned file for this GPU and (E, N), the entry nearest in
    tokens, else its default for BF16 (fused_moe.py get_default_config)."""
    name = device_name.replace(" ", "_")
    if "H200" in name.split("_"):
        name = "NVIDIA_H200"
    tuned = fused_moe_py.parent / "configs" / f"E={experts},N={width},device_name={name}.json"
    if tuned.is_file():
        table = {int(k): v for k, v in json.loads(tuned.read_text()).items() if k != "triton_version"}
        return dict(table[min(table, key=lambda m: abs(m - tokens))]), "tuned"
    block_m = 16 if tokens <= 32 else 32 if tokens <= 96 else 64 if tokens <= 512 else 128
    return {"BLOCK_SIZE_M": block_m, "BLOCK_SIZE_N": 64 if tokens <= 64 else 128,
            "BLOCK_SIZE_K": 128 if tokens <= 64 else 64, "GROUP_SIZE_M": 16 if tokens // experts > 128 else 1,
            "num_warps": 4 if tokens <= 128 else 8, "num_stages": 4 if tokens <= 32 else 3}, "default"


def align(topk_ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What vLLM's moe_align_block_size gives: the token-expert pairs sorted by expert, each expert's run padded to
    a multiple of block_m with an out-of-range index, the expert of each block, and the padded length."""
    flat = topk_ids.flatten()
    counts = torch.bincount(flat, minlength=experts)
    padded = (counts + block_m - 1) // block_m * block_m
    total = int(padded.sum())
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    first_padded = torch.cumsum(padded, 0) - padded
    first = torch.cumsum(counts, 0) - counts
    slots = first_padded[experts_sorted] + torch.arange(flat.numel(), device=flat.device) - first[experts_sorted]
    sorted_ids = torch.full((total,), flat.numel(), dtype=torch.int32, device=flat.device)
    sorted_ids[slots] = order.int()
    expert_ids = torch.repeat_interleave(torch.arange(experts, device=flat.device, dtype=torch.int32),
                                         padded // block_m)
    return sorted_ids, expert_ids, torch.tensor([total], dtype=torch.int32, device=flat.device)


class VllmMoe:
    """One MoE layer's routed experts through vLLM's kernel, for fixed tokens and routing."""

    def __init__(self, kernels: ModuleType, fused_moe_py: Path, device_name: str, hidden: int, width: int,
                 experts: int, top_k: int, tokens: int, device: torch.device,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        import triton.language as tl  # noqa: PLC0415

        self.kernel = kernels.fused_moe_kernel
        self.compute_type = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]
        self.top_k, self.width, self.hidden = top_k, width, hidden
        self.config, self.config_source = config(fused_moe_py, device_name, experts, width, tokens)
        self.w1 = torch.randn(experts, 2 * width, hidden, dtype=dtype, device=device) * 0.02
        self.w2 = torch.randn(experts, hidden, width, dtype=dtype, device=device) * 0.02
        self.x = torch.randn(tokens, hidden, dtype=dtype, device=device)
        scores = torch.rand(tokens, experts, device=device)
        weights, self.ids = torch.topk(torch.softmax(scores, dim=-1), top_k)
        self.weights = weights.float().contiguous()
        self.sorted_ids, self.expert_ids, self.padded = align(self.ids, experts, self.config["BLOCK_SIZE_M"])
        self.gate_up = torch.empty(tokens, top_k, 2 * width, dtype=dtype, device=device)
        self.down = torch.empty(tokens, top_k, hidden, dtype=dtype, device=device)

    def _launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, top_k: int, routed: bool) -> None:
        cfg = dict(self.config)
        block_k = cfg.pop("BLOCK_SIZE_K")
        cfg["SPLIT_K"] = 1
        em = self.sorted_ids.numel()
        if a.size(0) < cfg["BLOCK_SIZE_M"]:
            em = min(em, a.size(0) * top_k * cfg["BLOCK_SIZE_M"])
        n = b.size(1)

        def grid(meta: dict[str, int]) -> tuple[int]:
            return (-(-em // meta["BLOCK_SIZE_M"]) * -(-n // meta["BLOCK_SIZE_N"]),)

        self.kernel[grid](
            a, b, c, None, None, None, self.weights, self.sorted_ids, self.expert_ids, self.padded,
            n, b.size(2), em, a.size(0) * top_k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1), c.stride(1), c.stride(2),
            0, 0, 0, 0, 0, 0, 0, 0, 0,
            MUL_ROUTED_WEIGHT=routed, top_k=top_k, compute_type=self.compute_type, use_fp8_w8a8=False,
            use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False, naive_block_assignment=False,
            HAS_BIAS=False, BLOCK_SIZE_K=block_k, SWAP_AB=False, USE_TD=False, **cfg)

    def gemms(self) -> None:
        self._launch(self.x, self.w1, self.gate_up, self.top_k, routed=False)
        act = functional.silu(self.gate_up[..., : self.width]) * self.gate_up[..., self.width:]
        self._launch(act.view(-1, self.width), self.w2, self.down, 1, routed=True)

    def layer(self) -> torch.Tensor:
        self.gemms()
        return self.down.sum(dim=1)

    def reference(self) -> torch.Tensor:
        """The same layer in plain PyTorch, token by token: what the launch must give."""
        out = torch.zeros(self.x.shape, dtype=torch.float32, device=self.x.device)
        for t in range(self.x.size(0)):
            for j in range(self.top_k):
                e = int(self.ids[t, j])
                h = self.x[t].float() @ self.w1[e].float().t()
                a = functional.silu(h[: self.width]) * h[self.width:]
                out[t] += self.weights[t, j] * (a @ self.w2[e].float().t())
        return out
