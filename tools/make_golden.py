#!/usr/bin/env python3
"""make_golden.py: golden end-to-end fixtures from Hugging Face transformers.

Run where torch + transformers are installed (the GPU machine has them; no GPU is needed):

  python3 tools/make_golden.py models OUT          # stage 1: tiny random BF16 models of each
                                                   #   architecture + stories260K converted to HF
  fp4serve quantize OUT/<arch>-bf16 OUT/<arch>-nvfp4 --format nvfp4     (and nvfp4-ct, mxfp4)
  python3 tools/make_golden.py logits OUT          # stage 2: transformers' logits and greedy
                                                   #   tokens for every model folder in OUT

Stage 1 builds each model with transformers' own classes (random weights, seeded; norms, biases
and sinks randomized too so they are exercised), saves it in BF16 in the hub layout fp4serve
loads (Qwen3-MoE experts per expert, gpt-oss experts as [E, in, out]). Stage 2 computes FP32
logits: for BF16 folders from the weights as saved; for NVFP4 folders (ModelOpt or
compressed-tensors layout) from weights dequantized here, independently of fp4serve's decoder
(formats.md: w = e2m1 * e4m3 scale * weight_scale_2, or / weight_global_scale); for the gpt-oss
MXFP4 folder transformers' own MXFP4 loader (Mxfp4Config(dequantize=True)) is the oracle.

Each folder gets golden.json (prompts, greedy continuation) and logits.bin (float32 little-endian
[sum of prompt lengths, vocab], the prompts one after another).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
from safetensors.torch import save_file

SEED = 1234
VOCAB = 512
PROMPT_LENS = (12, 23)
GREEDY = 32


def rand_prompts(vocab, seed):
    g = np.random.default_rng(seed)
    return [[int(t) for t in g.integers(3, vocab, n)] for n in PROMPT_LENS]


def randomize(model, std=0.02):
    """Normal weights with std 0.02, norms 1 + 0.1 N(0,1), biases and sinks N(0, 0.1^2): every
    tensor carries signal, so a forward pass that skips one is caught."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias") or "sinks" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(std * torch.randn(p.shape, generator=g))


def configs():
    from transformers import GptOssConfig, LlamaConfig, Qwen3Config, Qwen3MoeConfig
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1,
                  eos_token_id=2)
    return {
        "llama": LlamaConfig(**common, intermediate_size=128, head_dim=16, rms_norm_eps=1e-5,
                             rope_theta=500000.0, tie_word_embeddings=False,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 64}),
        "qwen3": Qwen3Config(**common, intermediate_size=128, head_dim=32, rms_norm_eps=1e-6,
                             rope_theta=1000000.0, tie_word_embeddings=True),
        "qwen3_moe": Qwen3MoeConfig(**common, intermediate_size=128, head_dim=32,
                                    rms_norm_eps=1e-6, rope_theta=1000000.0, num_experts=8,
                                    num_experts_per_tok=2, moe_intermediate_size=32,
                                    norm_topk_prob=True, decoder_sparse_step=1,
                                    mlp_only_layers=[1], tie_word_embeddings=False),
        "gpt_oss": GptOssConfig(**common, intermediate_size=64, head_dim=16, num_local_experts=4,
                                num_experts_per_tok=2, sliding_window=4,
                                layer_types=["sliding_attention", "full_attention"],
                                rope_theta=150000.0, rms_norm_eps=1e-5, attention_bias=True,
                                tie_word_embeddings=False, swiglu_limit=7.0,
                                rope_scaling={"rope_type": "yarn", "factor": 32.0,
                                              "beta_fast": 32.0, "beta_slow": 1.0,
                                              "original_max_position_embeddings": 64,
                                              "truncate": False}),
    }


def hub_state_dict(arch, model, cfg):
    """The state dict in the layout the hub checkpoints use."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {}
    for k, v in sd.items():
        if arch == "qwen3_moe" and k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            E, two_i, H = v.shape
            inter = two_i // 2
            for e in range(E):
                out[f"{pre}{e}.gate_proj.weight"] = v[e, :inter].contiguous()
                out[f"{pre}{e}.up_proj.weight"] = v[e, inter:].contiguous()
        elif arch == "qwen3_moe" and k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{pre}{e}.down_proj.weight"] = v[e].contiguous()
        elif arch == "gpt_oss" and (k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")):
            # the dequantized HF layout is [E, in, out]; transformers versions that hold
            # [E, out, in] are transposed back to it
            H, I = cfg.hidden_size, cfg.intermediate_size
            want_in = H if k.endswith("gate_up_proj") else I
            if v.shape[1] != want_in:
                v = v.transpose(1, 2)
            out[k] = v.contiguous()
        else:
            out[k] = v
    if cfg.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def stage_models(outdir):
    from transformers import AutoModelForCausalLM
    os.makedirs(outdir, exist_ok=True)
    for arch, cfg in configs().items():
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(cfg)
        randomize(model)
        model = model.to(torch.bfloat16)
        d = os.path.join(outdir, f"{arch}-bf16")
        os.makedirs(d, exist_ok=True)
        sd = hub_state_dict(arch, model, cfg)
        save_file(sd, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        cfgd = cfg.to_dict()
        cfgd["torch_dtype"] = "bfloat16"
        cfgd["architectures"] = [type(model).__name__]
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfgd, f, indent=1)
        print(f"{d}: {sum(v.numel() for v in sd.values())} parameters, {len(sd)} tensors")
    stories(outdir)


def stories(outdir):
    """stories260K (llama2.c format) converted to an HF Llama checkpoint: logits for fixtures."""
    shared = os.environ.get("FP4S_STORIES", "stories260K.bin")
    if not os.path.exists(shared):
        print(f"skip stories260K: {shared} not found")
        return
    from transformers import LlamaConfig
    raw = open(shared, "rb").read()
    dim, hidden, L, nh, nkv, vocab, seq = struct.unpack("<7i", raw[:28])
    shared_cls = vocab > 0
    vocab = abs(vocab)
    hs = dim // nh
    kvd = nkv * hs
    a = np.frombuffer(raw, dtype="<f4", offset=28)
    o = 0

    def take(*shape):
        nonlocal o
        n = int(np.prod(shape))
        t = a[o:o + n].reshape(shape)
        o += n
        return torch.tensor(t.copy())

    emb = take(vocab, dim)
    rms_att = take(L, dim)
    wq = take(L, dim, dim)
    wk = take(L, kvd, dim)
    wv = take(L, kvd, dim)
    wo = take(L, dim, dim)
    rms_ffn = take(L, dim)
    w1 = take(L, hidden, dim)
    w2 = take(L, dim, hidden)
    w3 = take(L, hidden, dim)
    rms_final = take(dim)
    o += seq * hs // 2 * 2  # freq_cis_real, freq_cis_imag
    wcls = emb if shared_cls else take(vocab, dim)

    def permute(w, heads):  # interleaved RoPE pairs -> rotate-half (HF's conversion)
        out_f, in_f = w.shape
        return w.view(heads, out_f // heads // 2, 2, in_f).transpose(1, 2).reshape(out_f, in_f)

    sd = {"model.embed_tokens.weight": emb, "model.norm.weight": rms_final}
    if not shared_cls:
        sd["lm_head.weight"] = wcls
    for i in range(L):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = rms_att[i]
        sd[p + "post_attention_layernorm.weight"] = rms_ffn[i]
        sd[p + "self_attn.q_proj.weight"] = permute(wq[i], nh)
        sd[p + "self_attn.k_proj.weight"] = permute(wk[i], nkv)
        sd[p + "self_attn.v_proj.weight"] = wv[i]
        sd[p + "self_attn.o_proj.weight"] = wo[i]
        sd[p + "mlp.gate_proj.weight"] = w1[i]
        sd[p + "mlp.down_proj.weight"] = w2[i]
        sd[p + "mlp.up_proj.weight"] = w3[i]
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden,
                      num_hidden_layers=L, num_attention_heads=nh, num_key_value_heads=nkv,
                      max_position_embeddings=seq, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=shared_cls, bos_token_id=1, eos_token_id=2)
    d = os.path.join(outdir, "stories260K-hf")
    os.makedirs(d, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
    cfgd = cfg.to_dict()
    cfgd["torch_dtype"] = "float32"
    cfgd["architectures"] = ["LlamaForCausalLM"]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfgd, f, indent=1)
    print(f"{d}: converted")


E2M1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6],
                    dtype=torch.float64)


def e4m3_to_f64(b):
    b = b.to(torch.int64)
    e, m = (b >> 3) & 15, (b & 7).to(torch.float64)
    s = torch.where((b & 0x80) != 0, -1.0, 1.0).to(torch.float64)
    v = torch.where(e == 0, m * 2.0 ** -9, (1 + m / 8.0) * torch.exp2(e.to(torch.float64) - 7.0))
    return s * v


def dequant_nvfp4(packed, scales, ws2):
    """ModelOpt/compressed-tensors NVFP4: element 2i in the low nibble of byte i."""
    p = packed.to(torch.int64)
    q = torch.stack([E2M1[p & 15], E2M1[p >> 4]], dim=-1).reshape(p.shape[0], -1)
    s = torch.repeat_interleave(e4m3_to_f64(scales.view(torch.uint8)), 16, dim=1)
    return q * s * float(ws2)


def load_dequantized(d):
    """The folder's weights as FP32 tensors, NVFP4 layers dequantized here."""
    from safetensors.torch import load_file
    sd = {}
    for fn in sorted(os.listdir(d)):
        if fn.endswith(".safetensors"):
            sd.update(load_file(os.path.join(d, fn)))
    out = {}
    skip = (".weight_scale", ".weight_scale_2", ".weight_global_scale", ".input_scale",
            ".input_global_scale")
    for k, v in sd.items():
        if k.endswith(skip):
            continue
        if k.endswith(".weight_packed") or (k.endswith(".weight") and v.dtype == torch.uint8):
            pre = k.rsplit(".", 1)[0]
            if pre + ".weight_scale_2" in sd:
                ws2 = float(sd[pre + ".weight_scale_2"].reshape(-1)[0])
            else:
                ws2 = 1.0 / float(sd[pre + ".weight_global_scale"].reshape(-1)[0])
            out[pre + ".weight"] = dequant_nvfp4(v, sd[pre + ".weight_scale"], ws2).float()
        else:
            out[k] = v.float()
    return out


def hf_model_for(d):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(d)
    qc = getattr(cfg, "quantization_config", None)
    if isinstance(qc, dict) and qc.get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config
        # The dequantized experts come back in BF16 (exact for MXFP4); .float() makes the
        # expert matmuls FP32 like the rest, so the oracle's own rounding stays below 1e-6.
        model = AutoModelForCausalLM.from_pretrained(
            d, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32,
            attn_implementation="eager")
        return model.float(), "transformers Mxfp4Config(dequantize=True), computed in FP32"
    if qc is not None and hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    if "-bf16" in d or "stories" in d:
        return AutoModelForCausalLM.from_pretrained(
            d, dtype=torch.float32, attn_implementation="eager"), "weights as saved, FP32"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
    sd = load_dequantized(d)
    arch = cfg.model_type
    # hub layout back to this transformers version's module layout
    ms = model.state_dict()
    fixed = {}
    for k in ms:
        if k in sd:
            fixed[k] = sd[k]
        elif arch == "qwen3_moe" and k.endswith("mlp.experts.gate_up_proj"):
            pre = k[: -len("gate_up_proj")]
            E = ms[k].shape[0]
            fixed[k] = torch.stack([torch.cat([sd[f"{pre}{e}.gate_proj.weight"],
                                               sd[f"{pre}{e}.up_proj.weight"]]) for e in range(E)])
        elif arch == "qwen3_moe" and k.endswith("mlp.experts.down_proj"):
            pre = k[: -len("down_proj")]
            fixed[k] = torch.stack([sd[f"{pre}{e}.down_proj.weight"] for e in range(ms[k].shape[0])])
        elif k == "lm_head.weight" and cfg.tie_word_embeddings:
            fixed[k] = sd["model.embed_tokens.weight"]
        else:
            raise KeyError(f"{d}: no weight for {k}")
        if fixed[k].shape != ms[k].shape and fixed[k].dim() == 3:
            fixed[k] = fixed[k].transpose(1, 2)
    model.load_state_dict(fixed)
    return model, "weights dequantized by tools/make_golden.py (numpy), FP32"


def stage_logits(outdir):
    for name in sorted(os.listdir(outdir)):
        d = os.path.join(outdir, name)
        if not os.path.exists(os.path.join(d, "config.json")):
            continue
        model, oracle = hf_model_for(d)
        model.eval()
        vocab = model.config.vocab_size
        prompts = [[1] + rand_prompts(vocab, SEED)[0][:7]] if "stories" in name else rand_prompts(vocab, SEED)
        rows = []
        with torch.no_grad():
            for p in prompts:
                rows.append(model(torch.tensor([p])).logits[0].float().numpy())
            gen = model.generate(torch.tensor([prompts[0]]), max_new_tokens=GREEDY, do_sample=False,
                                 min_new_tokens=GREEDY, pad_token_id=0)
        greedy = [int(t) for t in gen[0, len(prompts[0]):]]
        np.concatenate(rows).astype("<f4").tofile(os.path.join(d, "logits.bin"))
        meta = {"vocab": vocab, "prompts": prompts, "greedy_prompt": 0, "greedy": greedy,
                "oracle": oracle, "transformers": __import__("transformers").__version__,
                "torch": torch.__version__}
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(f"{d}: {oracle}; greedy {greedy[:8]}...")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("models", "logits"):
        sys.exit(__doc__)
    (stage_models if sys.argv[1] == "models" else stage_logits)(sys.argv[2])
