"""HF <-> MindSpore weight interop, checkpoint files, and clear errors on bad checkpoints/configs."""
import json
import os
import re
import struct

import numpy as np
import pytest

from hf_reference import make_hf_model, tiny_model_kwargs
from model_helpers import load_ours
from mindrlhf.checkpoint.hf_interop import export_hf, hf_weight_files, iter_hf_as_ms
from mindrlhf.checkpoint.model_io import (load_full_weights, load_weights, model_state, read_checkpoint,
                                         save_checkpoint)
from mindrlhf.checkpoint.safetensors_io import SafeTensorsFile, SafeTensorsStreamWriter, write_safetensors
from mindrlhf.configs import CheckpointError, ConfigError, ModelConfig, load_model_yaml
from mindrlhf.utils.bf16 import bf16_to_f32, f32_to_bf16
from mindrlhf.models.qwen2 import CausalLM
from mindrlhf.models.specs import param_specs


def _file_tensors(path):
    out = {}
    for f in hf_weight_files(path):
        st = SafeTensorsFile(f)
        out.update({k: (st.dtype_code(k), np.array(st.get(k))) for k in st.keys()})
    return out


def test_hf_roundtrip_bit_exact_fp32(tmp_path):
    src, dst = tmp_path / "hf", tmp_path / "back"
    make_hf_model(str(src), qkv_bias=True, tie=False)
    cfg = ModelConfig(**tiny_model_kwargs(True, False))
    model = load_ours(str(src), cfg)
    export_hf(model_state(model), str(dst), cfg)
    a, b = _file_tensors(str(src)), _file_tensors(str(dst))
    assert set(a) == set(b)
    for k in a:
        assert a[k][0] == b[k][0] and a[k][1].tobytes() == b[k][1].tobytes(), k


def test_hf_roundtrip_bit_exact_bf16_and_sharded_index(tmp_path):
    """bf16 weights through a bf16 model and back; the export is split into several shards + index."""
    cfg = ModelConfig(**tiny_model_kwargs(True, True), param_init_type="bfloat16")
    rng = np.random.RandomState(0)
    full = {n: f32_to_bf16(rng.randn(*shape).astype(np.float32)) for n, (shape, _) in param_specs(cfg).items()}
    export_hf(full, str(tmp_path / "src"), cfg, max_shard_bytes=20_000, torch_dtype="bfloat16")
    assert os.path.isfile(tmp_path / "src" / "model.safetensors.index.json")
    assert len(hf_weight_files(str(tmp_path / "src"))) > 1
    model = CausalLM(cfg)
    load_full_weights(model, iter_hf_as_ms(str(tmp_path / "src")), "src")
    export_hf(model_state(model), str(tmp_path / "dst"), cfg, torch_dtype="bfloat16")
    a, b = _file_tensors(str(tmp_path / "src")), _file_tensors(str(tmp_path / "dst"))
    assert set(a) == set(b)
    for k in a:
        assert a[k][0] == b[k][0] == "BF16" and a[k][1].tobytes() == b[k][1].tobytes(), k


def test_exported_hf_loads_in_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM
    from hf_reference import hf_logits
    cfg = ModelConfig(**tiny_model_kwargs(True, False))
    model = CausalLM(cfg)
    export_hf(model_state(model), str(tmp_path), cfg)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), torch_dtype=torch.float32)
    from model_helpers import model_inputs
    ids = np.arange(10).reshape(1, 10) % 160
    ref = hf_logits(hf, ids)
    got = model.full_logits(*model_inputs(ids)).asnumpy()
    assert np.abs(ref - got).max() <= 1e-4


@pytest.mark.parametrize("ext", [".ckpt", ".safetensors"])
def test_mindspore_checkpoint_roundtrip(tmp_path, ext):
    cfg = ModelConfig(**tiny_model_kwargs(False, False))
    model = CausalLM(cfg)
    state = model_state(model)
    path = str(tmp_path / ("model" + ext))
    save_checkpoint(state, path)
    back = read_checkpoint(path)
    assert set(back) == set(state)
    for k in state:
        assert np.array_equal(back[k], state[k]), k
    other = CausalLM(cfg)
    load_full_weights(other, back.items(), path)
    for k, v in model_state(other).items():
        assert np.array_equal(v, state[k])
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_bf16_conversion_rounds_to_nearest_even():
    x = np.array([1.0, 1.00390625, 1.01171875, -3.5, 1e-40], np.float32)
    back = bf16_to_f32(f32_to_bf16(x))
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == 1.015625 and back[3] == -3.5


def _full_state(cfg):
    return model_state(CausalLM(cfg))


def test_missing_weight_names_the_parameter(tmp_path):
    cfg = ModelConfig(**tiny_model_kwargs(True, False))
    state = _full_state(cfg)
    del state["model.layers.1.attention.wv.bias"]
    with pytest.raises(CheckpointError, match=r"missing parameter model\.layers\.1\.attention\.wv\.bias.*\(32,\)"):
        load_full_weights(CausalLM(cfg), state.items(), "ckpt")


def test_wrong_shape_names_parameter_and_shapes():
    cfg = ModelConfig(**tiny_model_kwargs(True, False))
    state = _full_state(cfg)
    state["model.layers.0.feed_forward.w1.weight"] = np.zeros((90, 64), np.float32)
    with pytest.raises(CheckpointError, match=r"feed_forward\.w1\.weight has shape \(90, 64\).*expects \(96, 64\)"):
        load_full_weights(CausalLM(cfg), state.items(), "ckpt")


def test_unexpected_weight_is_an_error():
    cfg = ModelConfig(**tiny_model_kwargs(True, False))
    state = _full_state(cfg)
    state["model.layers.7.attention.wq.weight"] = np.zeros((64, 64), np.float32)
    with pytest.raises(CheckpointError, match=r"unexpected parameter model\.layers\.7"):
        load_full_weights(CausalLM(cfg), state.items(), "ckpt")


def test_corrupt_safetensors_is_reported(tmp_path):
    path = tmp_path / "bad.safetensors"
    write_safetensors(str(path), [("a", np.zeros((100,), np.float32))])
    data = path.read_bytes()
    path.write_bytes(data[:-40])  # truncated
    with pytest.raises(CheckpointError, match="bad.safetensors.*truncated"):
        SafeTensorsFile(str(path))



# ---- untrusted safetensors files: the header must describe the data exactly, as HF's safetensors checks ----
def _raw_safetensors(path, header, data=b"", length=None):
    """A file put together by hand: `header` as bytes or a dict (JSON-encoded), its length field `length`."""
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob) if length is None else length) + blob + data)
    return str(path)


def _f32(shape, begin, end=None):
    return {"dtype": "F32", "shape": list(shape), "data_offsets": [begin, begin + 4 * int(np.prod(shape))
                                                                    if end is None else end]}


_BAD_FILES = [  # id, header, bytes of data, what the error must say
    ("negative_offsets", {"w": _f32([2], -8, 0)}, 8, r"tensor w: data_offsets \[-8, 0\] .*0 <= begin <= end"),
    ("overlap", {"a": _f32([2], 0), "b": _f32([2], 4)}, 12, r"tensor b \(bytes 4\.\.12\) overlaps tensor a"),
    ("gap", {"a": _f32([2], 0), "b": _f32([2], 12)}, 20, r"4 bytes between tensor a and tensor b belong to no tensor"),
    ("past_the_end", {"a": _f32([4], 0)}, 8, r"tensor a runs past the end of the file .*truncated"),
    ("bytes_vs_shape", {"a": _f32([3], 0, 8)}, 8, r"tensor a: data_offsets \[0, 8\] hold 8 bytes, shape \[3\] of F32 "
                                                   r"needs 12"),
    ("unindexed_tail", {"a": _f32([2], 0)}, 12, r"4 bytes after tensor a belong to no tensor"),
    ("malformed_json", b'{"a": {"dtype": ', 0, r"header is not valid JSON"),
    ("header_not_a_dict", b"[1, 2]", 0, r"header is a list, expected a JSON object"),
    ("missing_data_offsets", {"w": {"dtype": "F32", "shape": [2]}}, 8, r"tensor w: missing data_offsets"),
    ("entry_not_a_dict", {"w": [0, 8]}, 8, r"tensor w: expected an object with dtype, shape and data_offsets"),
    ("negative_dim", {"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, 8,
     r"tensor w: shape \[-2\] is not a list of non-negative integers"),
    ("unknown_dtype", {"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 8]}}, 8,
     r"tensor w has unsupported dtype 'Q4'"),
    ("metadata_not_strings", {"__metadata__": {"step": 3}}, 0, r"__metadata__ must map strings to strings"),
]


@pytest.mark.parametrize("header, nbytes, message", [c[1:] for c in _BAD_FILES], ids=[c[0] for c in _BAD_FILES])
def test_untrusted_safetensors_header_is_checked(tmp_path, header, nbytes, message):
    path = _raw_safetensors(tmp_path / "x.safetensors", header, bytes(nbytes))
    with pytest.raises(CheckpointError, match=r"x\.safetensors: " + message):
        SafeTensorsFile(path)


def test_untrusted_safetensors_header_length_is_bounded(tmp_path):
    """A claimed header over 100 MB is refused before anything is read (the file is sparse: no disk used)."""
    path = tmp_path / "big.safetensors"
    _raw_safetensors(path, b"{}", length=100_000_001)
    with open(path, "r+b") as fh:
        fh.truncate(8 + 200_000_000)
    with pytest.raises(CheckpointError, match=r"big\.safetensors: header length 100000001 is over the limit of "
                                              r"100000000"):
        SafeTensorsFile(str(path))


@pytest.mark.parametrize("layout", ["full", "hf", "rank_dirs"])
def test_integer_tensor_is_not_loaded_as_a_weight(tmp_path, layout):
    """An I8 tensor of the right shape (a quantized or wrong file) would be cast into float weights silently."""
    cfg = ModelConfig(**tiny_model_kwargs(True, False))
    state = _full_state(cfg)
    state["model.norm_out.weight"] = np.ones(state["model.norm_out.weight"].shape, np.int8)
    root = tmp_path / "ck"
    if layout == "hf":
        export_hf(state, str(root), cfg)
        path, file, name = root, "model.safetensors", "model.norm.weight"
    else:
        folder = root / "rank_0" if layout == "rank_dirs" else root
        folder.mkdir(parents=True)
        save_checkpoint(state, str(folder / "w.safetensors"))
        path = root if layout == "rank_dirs" else folder / "w.safetensors"
        file, name = "w.safetensors", "model.norm_out.weight"
    with pytest.raises(CheckpointError, match=rf"{file}: tensor {re.escape(name)} has dtype I8, expected a float"):
        load_weights(CausalLM(cfg), str(path))


def test_safetensors_package_files_are_read_and_ours_are_read_by_it(tmp_path):
    """The checks accept what the safetensors package writes (bf16, ints, 0-element tensors, padded header),
    and it accepts what our two writers write."""
    import torch
    from safetensors.torch import load_file, save_file
    src = {"w": torch.randn(3, 4).to(torch.bfloat16), "empty": torch.zeros(0, 5), "ids": torch.arange(6),
           "h": torch.ones(2, dtype=torch.float16), "none": torch.zeros(0), "mask": torch.tensor([True, False])}
    save_file(src, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    f = SafeTensorsFile(str(tmp_path / "theirs.safetensors"))
    assert sorted(f.keys()) == sorted(src) and f.metadata == {"format": "pt"}
    assert (f.dtype_code("w"), f.dtype_code("ids"), f.dtype_code("mask")) == ("BF16", "I64", "BOOL")
    ours = {k: f.get(k) for k in f.keys()}
    for k, t in src.items():
        want = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        assert ours[k].shape == want.shape and ours[k].tobytes() == want.tobytes(), k
    write_safetensors(str(tmp_path / "ours.safetensors"), ours.items())
    stream = SafeTensorsStreamWriter(str(tmp_path / "stream.safetensors"),
                                     [(k, f.dtype_code(k), f.shape(k)) for k in f.keys()])
    for k in f.keys():
        stream.write(k, ours[k])
    stream.close()
    for name in ("ours", "stream"):
        back = load_file(str(tmp_path / f"{name}.safetensors"))
        assert all(torch.equal(back[k], src[k]) for k in src), name

def _write_yaml(tmp_path, model_config, parallel=None, extra=""):
    import yaml
    doc = {"model": {"model_config": model_config, "arch": {"type": "LlamaForCausalLM"}}}
    if parallel is not None:
        doc["parallel_config"] = parallel
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(doc) + extra)
    return str(path)


def test_yaml_unknown_field_is_named(tmp_path):
    path = _write_yaml(tmp_path, {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "hiden_size": 3})
    with pytest.raises(ConfigError, match=r"m\.yaml: model\.model_config\.hiden_size: unknown field"):
        load_model_yaml(path)


def test_yaml_invalid_value_is_named(tmp_path):
    path = _write_yaml(tmp_path, {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "compute_dtype": "fp8"})
    with pytest.raises(ConfigError, match=r"model\.model_config\.compute_dtype: expected one of"):
        load_model_yaml(path)
    path = _write_yaml(tmp_path, {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "n_kv_heads": 4,
                                  "vocab_size": 100}, {"model_parallel": 8})
    with pytest.raises(ConfigError, match=r"parallel_config\.model_parallel=8 does not divide"):
        load_model_yaml(path)


def test_shipped_yaml_configs_load():
    root = os.path.join(os.path.dirname(__file__), "..", "model_configs", "qwen_grpo")
    names = sorted(f for f in os.listdir(root) if f.endswith(".yaml"))
    assert "finetune_qwen2_5_7b.yaml" in names and "predict_qwen2_5_7b_instruct.yaml" in names
    for name in names:
        loaded = load_model_yaml(os.path.join(root, name))
        assert loaded.model.hidden_size > 0
    q7 = load_model_yaml(os.path.join(root, "finetune_qwen2_5_7b.yaml")).model
    assert (q7.hidden_size, q7.num_layers, q7.num_heads, q7.n_kv_heads, q7.intermediate_size, q7.vocab_size) == \
        (3584, 28, 28, 4, 18944, 152064)
    assert q7.qkv_has_bias and not q7.tie_word_embeddings


def test_param_specs_match_built_model():
    for kw in (tiny_model_kwargs(True, False), tiny_model_kwargs(False, True)):
        cfg = ModelConfig(**kw)
        built = {p.name: tuple(p.shape) for p in CausalLM(cfg).get_parameters()}
        assert built == {n: s for n, (s, _) in param_specs(cfg).items()}


def test_convert_cli_roundtrip(tmp_path):
    from mindrlhf.checkpoint.convert import main
    src = tmp_path / "hf"
    make_hf_model(str(src), qkv_bias=True, tie=False)
    assert main(["--hf_dir", str(src), "--output", str(tmp_path / "full.ckpt")]) == 0
    yaml_path = _write_yaml(tmp_path, tiny_model_kwargs(True, False))
    # the YAML helper writes LlamaForCausalLM arch; qkv bias makes the export a Qwen2 config
    assert main(["--to_hf", "--input", str(tmp_path / "full.ckpt"), "--model_yaml", yaml_path,
                 "--output", str(tmp_path / "back")]) == 0
    a, b = _file_tensors(str(src)), _file_tensors(str(tmp_path / "back"))
    assert set(a) == set(b) and all(a[k][1].tobytes() == b[k][1].tobytes() for k in a)
    assert main(["--hf_dir", str(tmp_path / "missing"), "--output", str(tmp_path / "x.ckpt")]) == 2


def test_mindformers_convert_weight_flags(tmp_path, capsys):
    """MindFormers' convert_weight.py flags: HF -> bf16 .ckpt (checked against the YAML), and --reversed back."""
    from mindrlhf.checkpoint.convert import mindformers_main
    src = tmp_path / "hf"
    make_hf_model(str(src), qkv_bias=True, tie=False)
    yaml_path = _write_yaml(tmp_path, tiny_model_kwargs(True, False))
    out = str(tmp_path / "w.ckpt")
    assert mindformers_main(["--model", "qwen2_5", "--input_path", str(src), "--output_path", out, "--dtype", "bf16",
                             "--config_path", yaml_path]) == 0
    hf = {k: v for k, (_, v) in _file_tensors(str(src)).items()}
    ours = dict(iter_hf_as_ms(str(src)))
    got = read_checkpoint(out)
    assert set(got) == set(ours)
    for name, arr in ours.items():      # bf16 of the HF fp32 values (round to nearest even)
        assert np.array_equal(bf16_to_f32(got[name]), bf16_to_f32(f32_to_bf16(np.asarray(arr, np.float32)))), name
    assert len(hf) == len(ours)
    # the older research/qwen2_5 spelling, fp32: --reversed gives the HF tensors back bit for bit
    assert mindformers_main(["--torch_ckpt_dir", str(src), "--mindspore_ckpt_path", str(tmp_path / "f.ckpt")]) == 0
    assert mindformers_main(["--reversed", "--input_path", str(tmp_path / "f.ckpt"), "--output_path",
                             str(tmp_path / "back"), "--config_path", yaml_path]) == 0
    back = _file_tensors(str(tmp_path / "back"))
    assert set(back) == set(hf) and all(back[k][1].tobytes() == hf[k].tobytes() for k in hf)
    # errors name the flag
    (tmp_path / "o").mkdir()
    other = _write_yaml(tmp_path / "o", dict(tiny_model_kwargs(True, False), intermediate_size=128))
    assert mindformers_main(["--input_path", str(src), "--output_path", str(tmp_path / "o.ckpt"),
                             "--config_path", other]) == 2
    assert mindformers_main(["--model", "glm", "--input_path", str(src), "--output_path", out]) == 2
    assert mindformers_main(["--input_path", str(src), "--output_path", out, "--dtype", "fp16"]) == 2
    err = capsys.readouterr().err
    assert "--config_path" in err and "the YAML's model expects" in err and "--model: 'glm' is not supported" in err
    assert "--dtype: expected fp32 or bf16" in err


def test_training_checkpoint_holds_one_tensor_copy_at_a_time(tmp_path):
    """A training checkpoint's shard is written one parameter at a time (checkpoint.model_io.save_params): while
    8 parameters of 4 MB and Adam's int32 step are saved, numpy's peak allocation (tracemalloc) stays under two
    of them, where copying them all first took the process to the model's size again at every save (+600 MB
    RSS for SmolLM2's policy and moments); the file reads back equal, dtypes kept."""
    import tracemalloc
    import mindspore as ms
    from mindspore import Parameter, Tensor
    from mindrlhf.trainer.checkpointing import save_params
    params = [Parameter(Tensor(np.full((1024, 1024), i + 0.5, np.float32)), name=f"w{i}") for i in range(8)]
    params.append(Parameter(Tensor(np.array([7], np.int32)), name="adam_step", requires_grad=False))
    path = str(tmp_path / "policy.safetensors")
    tracemalloc.start()
    try:
        save_params(params, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 4 * 2 ** 20, f"{peak / 2 ** 20:.1f} MB held while saving 8 x 4 MB"
    back = read_checkpoint(path)
    assert list(back) == [p.name for p in params]
    for p in params:
        assert back[p.name].dtype == p.asnumpy().dtype and np.array_equal(back[p.name], p.asnumpy())
    assert ms.float32 == params[0].dtype
