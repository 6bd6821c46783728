"""The model forward that the engines and the trainer share by design.

``lean.LlamaForward`` runs a Llama-family HF model layer by layer through the model's own modules
(so PEFT LoRA layers and trained weights are always the live ones): the engines use it for
prefill and decode over their KV caches, the trainer for logprobs with gradients. One forward for
both keeps rollout and trainer numerics as close as the kernels allow (the gap is reported every
step as the logprob mismatch). ``prefix`` groups rows that share a prompt prefix.
"""
