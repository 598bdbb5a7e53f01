"""tensorrt_llm_bls: the ensemble's text API in one Python model (tokenize -> tensorrt_llm -> bytes).

Tokenizing and detokenizing in-process saves the two extra model hops of the ensemble; the
engine is called through BLS, streaming when the client streams. Same inputs and outputs as
the ensemble: `text_output` flat, one entry per response (a client reads text_output[0]), and
whatever else the engine returns (log probs, perf outputs) passed through under its name.
Each request is served on a thread of its own (a bounded pool): a BLS call blocks while it waits
for the engine's next response, and one long generation must not hold up the others. (The Python
backend's async execute does not help here: its decoupled BLS iterator still blocks.)
Built with --no-decoupled it answers each request with one response from execute.

Config parameters (written by `toolkit build`): `engine_tensor_names` (JSON: text input -> the
engine input it feeds, under the names the engine's TensorRT-LLM release reads) and
`engine_outputs` (the engine outputs to ask for).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(__file__))
from engine_requests import Collector  # noqa: E402
from params import error_response, final_flag, scalar, start_model  # noqa: E402
from textcodec import check_request_lengths, codec_beside, pack_word_lists  # noqa: E402
from tracing import ENGINE_SWITCH, TRACEPARENT, request_context  # noqa: E402

# Inputs passed on whole (an adapter sent with the request: one row per adapter module), not as [1, 1] scalars;
# lora_weights is BF16 on a bf16 GPU engine, which numpy cannot hold, so they go through DLPack unchanged.
WHOLE_TENSORS = ("lora_weights", "lora_config")

TOKEN_OUTPUTS = ("output_ids", "sequence_length")  # turned into text_output


def _final() -> int:
    return final_flag(pb_utils)


def _error(message: str):
    return error_response(pb_utils, message)


class TritonPythonModel:
    def initialize(self, args):
        params = start_model(args)
        self.codec = codec_beside(__file__, params)
        self.engine = params.text("tensorrt_llm_model_name")
        self.decoupled = params.flag("decoupled")
        self.passthrough = json.loads(params.text("engine_tensor_names"))
        self.engine_outputs = [name for name in params.text("engine_outputs").split(",") if name]
        self.streaming_name = self.passthrough.pop("stream")
        self.end_id = params.integer("end_id")
        self.stop_ids = params.ids("stop_ids")
        self.add_special_tokens = params.flag("add_special_tokens")
        bos = params.integer("bos_id")
        self.bos_id = None if bos < 0 else bos
        self.limits = tuple(
            params.integer(k) for k in ("max_input_len", "max_output_len", "max_seq_len")
        )
        # With tracing on, the engine call carries this request's trace context as a parameter. Never as
        # `trace=request.trace()`: from a pool thread, after a decoupled execute() has returned, that
        # crashes tritonserver 2.51 (SIGSEGV in TRITONSERVER_ServerInferAsync).
        self.forward_context = os.environ.get(ENGINE_SWITCH) == "1"
        # As many requests in flight as the engine batches; more wait in the pool's queue.
        self.pool = ThreadPoolExecutor(
            max_workers=max(1, params.integer("max_concurrent_requests")), thread_name_prefix="bls"
        )

    def execute(self, requests):
        senders = [
            request.get_response_sender() if self.decoupled else Collector(pb_utils)
            for request in requests
        ]
        for request, sender in zip(requests, senders, strict=True):
            # read in execute(), while Triton's request object is certainly whole
            context = request_context(request) if self.forward_context else None
            self.pool.submit(self._serve_one, request, sender, context)
        if self.decoupled:
            return None
        return [sender.wait() for sender in senders]

    def _serve_one(self, request, sender, context: str | None = None) -> None:
        try:
            self._serve(request, sender, context)
        except Exception as exc:  # noqa: BLE001 - each request's failure is its own final error
            message = (
                str(exc)
                if isinstance(exc, ValueError)
                else f"tensorrt_llm_bls: {type(exc).__name__}: {exc}"
            )
            sender.send(_error(message), flags=_final())

    def finalize(self):
        # never hang the unload on a request still waiting for the engine
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _serve(self, request, sender, context: str | None = None) -> None:
        extra = {"parameters": {TRACEPARENT: context}} if context else {}
        engine_request = pb_utils.InferenceRequest(
            model_name=self.engine,
            inputs=self._engine_inputs(request),
            requested_output_names=self.engine_outputs,
            **extra,
        )
        if not self.decoupled:
            response = engine_request.exec()
            if response.has_error():
                sender.send(_error(response.error().message()), flags=_final())
            else:
                sender.send(
                    pb_utils.InferenceResponse(output_tensors=self._text_outputs(response)),
                    flags=_final(),
                )
            return
        responses = engine_request.exec(decoupled=True)
        for response in responses:
            if request.is_cancelled():
                # Python backend 24.08+: stops the engine's work too
                if hasattr(responses, "cancel"):
                    responses.cancel()
                sender.send(flags=_final())
                return
            if response.has_error():
                sender.send(_error(response.error().message()), flags=_final())
                return
            outputs = self._text_outputs(response)
            if outputs:
                sender.send(pb_utils.InferenceResponse(output_tensors=outputs))
        sender.send(flags=_final())

    def _engine_inputs(self, request) -> list:
        text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
        max_tokens = int(
            pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0]
        )
        prompt = self.codec.encode_prompt(
            text.decode("utf-8") if isinstance(text, bytes) else str(text),
            self.add_special_tokens,
            self.bos_id,
        )
        check_request_lengths(len(prompt), max_tokens, *self.limits)
        stream = bool(scalar(pb_utils, request, "stream", False))
        under_min_tokens = int(scalar(pb_utils, request, "min_tokens", 0) or 0) > 0
        inputs = [
            pb_utils.Tensor("input_ids", np.array([prompt], dtype=np.int32)),
            pb_utils.Tensor("input_lengths", np.array([[len(prompt)]], dtype=np.int32)),
            pb_utils.Tensor("request_output_len", np.array([[max_tokens]], dtype=np.int32)),
            pb_utils.Tensor(self.streaming_name, np.array([[stream]], dtype=bool)),
            pb_utils.Tensor("stop_words_list", self._stop_words(request, under_min_tokens)),
        ]
        if pb_utils.get_input_tensor_by_name(request, "end_id") is None:
            inputs.append(pb_utils.Tensor("end_id", np.array([[self.end_id]], dtype=np.int32)))
        for source, target in self.passthrough.items():
            tensor = pb_utils.get_input_tensor_by_name(request, source)
            if tensor is None:
                continue
            if (
                source in WHOLE_TENSORS
            ):  # as the client sent it, [1, rows, columns]; BF16 has no numpy type
                inputs.append(pb_utils.Tensor.from_dlpack(target, tensor.to_dlpack()))
            else:
                inputs.append(pb_utils.Tensor(target, tensor.as_numpy().reshape(1, 1)))
        return inputs

    def _text_outputs(self, response) -> list:
        """text_output (flat, the stock shape) from the engine's tokens, then its other outputs by name."""
        ids = pb_utils.get_output_tensor_by_name(response, "output_ids")
        if ids is None:
            return []
        lengths = pb_utils.get_output_tensor_by_name(response, "sequence_length").as_numpy()
        tokens = ids.as_numpy()
        outputs = [
            pb_utils.Tensor(
                "text_output",
                np.array(
                    [self.codec.decode_bytes(tokens[0, 0, : lengths[0, 0]].tolist())], dtype=object
                ),
            )
        ]
        for name in self.engine_outputs:
            tensor = (
                None
                if name in TOKEN_OUTPUTS
                else pb_utils.get_output_tensor_by_name(response, name)
            )
            if tensor is not None:
                outputs.append(pb_utils.Tensor(name, tensor.as_numpy()))
        return outputs

    def _stop_words(self, request, under_min_tokens: bool) -> np.ndarray:
        """The request's stop words, plus the model's other end tokens unless min_tokens holds ends back."""
        words = pb_utils.get_input_tensor_by_name(request, "stop_words")
        texts = [
            w.decode("utf-8") if isinstance(w, bytes) else str(w)
            for w in (words.as_numpy().reshape(-1) if words is not None else [])
        ]
        ids = [self.codec.encode(t, False) for t in texts if t]
        return pack_word_lists([ids + ([] if under_min_tokens else [[i] for i in self.stop_ids])])
