"""The distributed executor's building blocks over torch.distributed (NCCL on GPUs, gloo on CPU).

`p2p` holds the one point-to-point primitive everything that passes tensors between ranks uses
(ring context parallelism, METP's weight ring, SPPO's pipeline stages).
"""
