"""postprocessing: token ids -> text as exact UTF-8 bytes (see textcodec for why bytes)."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from textcodec import TextCodec  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        tokenizer = config.get("parameters", {}).get("tokenizer_dir", {}).get("string_value", "tokenizer")
        self.codec = TextCodec(os.path.join(os.path.dirname(__file__), tokenizer))

    def execute(self, requests):
        decode = self.codec.decode_bytes
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
            lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
            # tokens: [batch, beam, tokens]; lengths: [batch, beam]
            batch, beams = tokens.shape[0], tokens.shape[1]
            text = np.empty((batch, beams), dtype=object)
            for b in range(batch):
                for k in range(beams):
                    text[b, k] = decode(tokens[b, k, : lengths[b, k]].tolist())
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", text)]))
        return responses
