"""Converting an embedded GGUF: transformers asks gguf for the same file's reader three times and for the
same tensor-name map once per module; the conversion answers each from one parse / one map, with what
gguf's own reader reads. (The whole conversion: test_gemma3_embedded and the session's served_repo.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from toolkit.model.embedded import _gguf_parsed_once


def _tiny_gguf(path: Path, tokens: int = 300) -> Path:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_uint32("llama.block_count", 2)
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(tokens)])
    writer.add_array("tokenizer.ggml.scores", [float(-i) for i in range(tokens)])
    writer.add_array("tokenizer.ggml.token_type", [1 + i % 3 for i in range(tokens)])
    writer.add_string("general.name", "tiny")
    writer.add_tensor(
        "token_embd.weight", np.arange(tokens * 4, dtype=np.float32).reshape(tokens, 4)
    )
    writer.add_tensor("output_norm.weight", np.ones(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_one_parse_per_conversion_reading_what_gguf_reads(tmp_path):
    import gguf

    path, other = _tiny_gguf(tmp_path / "tiny.gguf"), _tiny_gguf(tmp_path / "other.gguf", 10)
    reader_class, name_map_function = gguf.GGUFReader, gguf.get_tensor_name_map
    expected = gguf.GGUFReader(path)
    with _gguf_parsed_once(path):
        read = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(path) is read  # the second and third ask parse nothing
        assert type(read.data) is np.ndarray  # parsed over a plain array, not through memmap slices
        assert (
            gguf.GGUFReader(tmp_path / "." / "tiny.gguf") is read
        )  # the same file, spelt otherwise
        assert gguf.GGUFReader(other) is not read and len(gguf.GGUFReader(other).tensors) == 2
        name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is name_map
        assert name_map.get_name("model.layers.1.self_attn.q_proj") == "blk.1.attn_q"
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 3) is not name_map
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == (reader_class, name_map_function)
    assert gguf.GGUFReader(path) is not read  # outside a conversion, gguf's own again

    # What the one parse holds is what gguf's reader holds: every field's parts, types and data.
    assert list(read.fields) == list(expected.fields)
    for key, field in expected.fields.items():
        got = read.fields[key]
        assert (got.offset, got.types, got.data) == (field.offset, field.types, field.data), key
        assert len(got.parts) == len(field.parts), key
        for mine, theirs in zip(got.parts, field.parts, strict=True):
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), key
    assert read.fields["tokenizer.ggml.tokens"].contents()[299] == "tok299"
    assert [t.name for t in read.tensors] == [t.name for t in expected.tensors]
    for mine, theirs in zip(read.tensors, expected.tensors, strict=True):
        assert mine.tensor_type == theirs.tensor_type and np.array_equal(mine.data, theirs.data)
    assert float(read.tensors[0].data[299, 3]) == 299 * 4 + 3


def test_the_patch_is_undone_when_the_conversion_fails_and_nests(tmp_path):
    import gguf
    import pytest

    path, other = _tiny_gguf(tmp_path / "tiny.gguf"), _tiny_gguf(tmp_path / "other.gguf", 10)
    originals = (gguf.GGUFReader, gguf.get_tensor_name_map)
    with pytest.raises(RuntimeError, match="transformers failed"), _gguf_parsed_once(path):
        assert gguf.GGUFReader(path) is gguf.GGUFReader(path)
        raise RuntimeError("transformers failed")
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == originals
    # one conversion inside another (the same thread): each file parsed once, both undone in turn
    with _gguf_parsed_once(path):
        outer = gguf.GGUFReader(path)
        with _gguf_parsed_once(other):
            inner = gguf.GGUFReader(other)
            assert gguf.GGUFReader(other) is inner and len(inner.tensors) == 2
            assert gguf.GGUFReader(path) is outer
        assert gguf.GGUFReader(path) is outer
    assert (gguf.GGUFReader, gguf.get_tensor_name_map) == originals
