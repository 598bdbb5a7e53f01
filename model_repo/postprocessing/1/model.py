"""postprocessing: token ids -> text as exact UTF-8 bytes (see textcodec for why bytes), flat as the
stock model returns it.

It runs once per streamed piece (one engine response), batched across streams by the dynamic
batcher, so the per-request work is kept to what the contract needs: one pass over the request's
inputs, one table lookup per token, one BYTES tensor per response. The common streaming case
(one sequence, one beam) skips the general [batch, beam] loop.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from params import start_model  # noqa: E402
from textcodec import codec_beside  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        params = start_model(args)
        self.codec = codec_beside(__file__, params, params.flag("skip_special_tokens"))

    def execute(self, requests):
        table = self.codec.token_bytes
        size = len(table)
        decode = self.codec.decode_bytes
        Tensor, Response = pb_utils.Tensor, pb_utils.InferenceResponse
        responses = []
        for request in requests:
            tokens = lengths = None
            # one pass; get_input_tensor_by_name would scan once per name
            for tensor in request.inputs():
                name = tensor.name()
                if name == "TOKENS_BATCH":
                    tokens = tensor.as_numpy()
                elif name == "SEQUENCE_LENGTH":
                    lengths = tensor.as_numpy()
            # tokens: [batch, beam, tokens]; lengths: [batch, beam]. OUTPUT is flat, one entry per
            # (row, beam), as the stock model returns it: a client reads text_output[0].
            if tokens.shape[0] == 1 and tokens.shape[1] == 1:
                ids = tokens[0, 0, : lengths[0, 0]].tolist()
                if len(ids) == 1:
                    i = ids[0]
                    data = table[i] if 0 <= i < size else b""
                else:
                    data = decode(ids)
                text = np.array([data], dtype=object)
            else:
                rows, beams = tokens.shape[:2]
                text = np.empty(rows * beams, dtype=object)
                for b in range(rows):
                    for k in range(beams):
                        text[b * beams + k] = decode(tokens[b, k, : lengths[b, k]].tolist())
            responses.append(Response(output_tensors=[Tensor("OUTPUT", text)]))
        return responses
