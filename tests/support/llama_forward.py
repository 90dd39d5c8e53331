#!/usr/bin/python3
"""A Llama forward pass written from scratch, as Hugging Face's LlamaForCausalLM computes it, over an exported
directory (model.safetensors read by hand, config.json). The export test compares its logits with ours.

usage: llama_forward.py EXPORT_DIR TOKEN_IDS OUT_FILE   (TOKEN_IDS: "1,2,3"; OUT_FILE: "T V", then T lines)
Exit codes: 0 written, 2 bad arguments or files, 3 python3-torch is not installed.
"""
import json
import math
import struct
import sys

try:
    import torch
except ImportError:
    print("llama_forward.py: python3-torch is not installed (run scripts/setup, or apt-get install python3-torch)",
          file=sys.stderr)
    sys.exit(3)


def read_safetensors(path):
    """name -> float32 tensor, checking the header against the file as it goes."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the file ({len(data)} bytes)")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = memoryview(data)[8 + n:]
    tensors, end = {}, 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] != "F32":
            raise ValueError(f"{path}: {name} has dtype {info['dtype']}, expected F32")
        begin, stop = info["data_offsets"]
        shape = info["shape"]
        if stop - begin != 4 * math.prod(shape) or stop > len(body):
            raise ValueError(f"{path}: {name}: offsets {begin}..{stop} do not fit shape {shape}")
        tensors[name] = torch.frombuffer(bytearray(body[begin:stop]), dtype=torch.float32).reshape(shape)
        end = max(end, stop)
    if end != len(body):
        raise ValueError(f"{path}: data section has {len(body)} bytes, the tensors cover {end}")
    return tensors


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(w, cfg, ids):
    d, h, hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim", d // h)
    eps, t = cfg["rms_norm_eps"], len(ids)
    # RoPE as LlamaRotaryEmbedding: frequencies for the first half, repeated for the second (rotate_half pairs).
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()  # [T, hd]
    mask = torch.full((t, t), float("-inf")).triu(1)

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]  # [T, d]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(t, h, hd).transpose(0, 1)  # [h, T, hd]
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(t, hkv, hd).transpose(0, 1)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(t, hkv, hd).transpose(0, 1)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k[:, None].expand(hkv, h // hkv, t, hd).reshape(h, t, hd)  # repeat_kv
        v = v[:, None].expand(hkv, h // hkv, t, hd).reshape(h, t, hd)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        y = (att @ v).transpose(0, 1).reshape(t, h * hd)
        x = x + y @ w[p + "self_attn.o_proj.weight"].T
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (m @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T  # [T, V]


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    out_dir, ids, out_file = sys.argv[1], [int(i) for i in sys.argv[2].split(",")], sys.argv[3]
    with open(f"{out_dir}/config.json") as f:
        cfg = json.load(f)
    if cfg.get("architectures") != ["LlamaForCausalLM"] or cfg.get("model_type") != "llama":
        print(f"llama_forward.py: {out_dir}/config.json is not a LlamaForCausalLM config", file=sys.stderr)
        return 2
    with torch.no_grad():
        logits = forward(read_safetensors(f"{out_dir}/model.safetensors"), cfg, ids)
    with open(out_file, "w") as f:
        f.write(f"{logits.shape[0]} {logits.shape[1]}\n")
        for row in logits.tolist():
            f.write(" ".join(f"{v:.9g}" for v in row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
