"""preprocessing: text -> token ids, stop/bad word lists, end and pad ids (the stock model's contract).

Limits come from the model config's parameters, written by `toolkit build`: a prompt over
max_input_len, or max_tokens outside 1..max_output_len, is refused with an error that names
the limit; the error goes to that request only and the server keeps serving.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from params import error_response, start_model  # noqa: E402
from textcodec import check_request_lengths, codec_beside, pack_word_lists  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        params = start_model(args)
        self.codec = codec_beside(__file__, params)
        self.add_special_tokens = params.flag("add_special_tokens")
        bos = params.integer("bos_id")
        self.bos_id = None if bos < 0 else bos
        self.end_id = params.integer("end_id")
        self.pad_id = params.integer("pad_id")
        # the model's other end tokens: default one-token stop words
        self.stop_ids = params.ids("stop_ids")
        self.max_input_len = params.integer("max_input_len")
        self.max_output_len = params.integer("max_output_len")
        self.max_seq_len = params.integer("max_seq_len")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._process(request)))
            except ValueError as exc:
                responses.append(error_response(pb_utils, str(exc)))
        return responses

    def _process(self, request) -> list:
        queries = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()
        output_len = (
            pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy().reshape(-1)
        )
        batch = queries.shape[0]
        ids = [
            self.codec.encode_prompt(_text(q), self.add_special_tokens, self.bos_id)
            for q in queries.reshape(batch, -1)[:, 0]
        ]
        for prompt, max_tokens in zip(ids, output_len, strict=True):
            self._check_lengths(len(prompt), int(max_tokens))
        lengths = np.array([[len(p)] for p in ids], dtype=np.int32)
        input_ids = np.full((batch, max(len(p) for p in ids)), self.pad_id, dtype=np.int32)
        for row, prompt in enumerate(ids):
            input_ids[row, : len(prompt)] = prompt
        end_id = _optional_ids(request, "END_ID", batch, self.end_id)
        pad_id = _optional_ids(request, "PAD_ID", batch, self.pad_id)
        return [
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
            # Decoder-only models have no decoder prompt: the stock model sends pad_id, length 1.
            pb_utils.Tensor("DECODER_INPUT_ID", np.full((batch, 1), self.pad_id, dtype=np.int32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.ones((batch, 1), dtype=np.int32)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", output_len.reshape(batch, 1).astype(np.int32)),
            pb_utils.Tensor(
                "STOP_WORDS_IDS",
                self._word_lists(
                    request, "STOP_WORDS_DICT", batch, self._default_stops(request, batch)
                ),
            ),
            pb_utils.Tensor("BAD_WORDS_IDS", self._word_lists(request, "BAD_WORDS_DICT", batch)),
            pb_utils.Tensor("EMBEDDING_BIAS", self._embedding_bias(request, batch)),
            pb_utils.Tensor("OUT_END_ID", end_id),
            pb_utils.Tensor("OUT_PAD_ID", pad_id),
        ]

    def _default_stops(self, request, batch: int) -> list[tuple[int, ...]]:
        """The model's other end tokens stop a request as its end_id does; under min_tokens (which holds
        end_id back) they are left out, since the engine's stop words do not wait for min_tokens."""
        tensor = pb_utils.get_input_tensor_by_name(request, "MIN_TOKENS")
        floors = tensor.as_numpy().reshape(-1).tolist() if tensor is not None else [0] * batch
        return [() if floor > 0 else self.stop_ids for floor in floors]

    def _check_lengths(self, prompt_len: int, max_tokens: int) -> None:
        check_request_lengths(
            prompt_len, max_tokens, self.max_input_len, self.max_output_len, self.max_seq_len
        )

    def _word_lists(
        self, request, name: str, batch: int, defaults: list[tuple[int, ...]] | None = None
    ) -> np.ndarray:
        """The request's words as TensorRT-LLM's [batch, 2, N] lists, plus each row's `defaults` as one-token words."""
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        rows = (
            tensor.as_numpy().reshape(batch, -1)
            if tensor is not None
            else [[] for _ in range(batch)]
        )
        words = [[self.codec.encode(_text(w), False) for w in row if _text(w)] for row in rows]
        extra = defaults or [()] * batch
        return pack_word_lists(
            [row + [[i] for i in ids] for row, ids in zip(words, extra, strict=True)]
        )

    def _embedding_bias(self, request, batch: int) -> np.ndarray:
        words = pb_utils.get_input_tensor_by_name(request, "EMBEDDING_BIAS_WORDS")
        weights = pb_utils.get_input_tensor_by_name(request, "EMBEDDING_BIAS_WEIGHTS")
        if words is None or weights is None:
            return np.zeros((batch, 0), dtype=np.float32)
        bias = np.zeros((batch, self.codec.vocab_size), dtype=np.float32)
        for row, (row_words, row_weights) in enumerate(
            zip(
                words.as_numpy().reshape(batch, -1),
                weights.as_numpy().reshape(batch, -1),
                strict=True,
            )
        ):
            for word, weight in zip(row_words, row_weights, strict=False):
                ids = self.codec.encode(_text(word), False)
                if ids:
                    bias[row, ids[0]] += weight
        return bias


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _optional_ids(request, name: str, batch: int, default: int) -> np.ndarray:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return np.full((batch, 1), default, dtype=np.int32)
    return tensor.as_numpy().reshape(batch, 1).astype(np.int32)
