"""DeepEP (deepseek-ai/DeepEP; Megatron-Core's ``--moe-token-dispatcher-type flex
--moe-flex-dispatcher-backend deepep``, megatron/core/transformer/moe/README.md at d98e8a64:
"removes redundant tokens during cross-node communication, fuses intra/inter-node communication
into single kernel"): a token routed to several experts on one remote node crosses the inter-node
link once and is copied to those experts' GPUs over NVLink there; combine reduces on the node
first and sends one sum back. Priced by `memo_sim.cost.moe.ep_alltoall_dedup_time`."""

from __future__ import annotations

from memo_sim.layout.moe_dispatchers.base import Dispatcher, Step
from memo_sim.layout.moe_dispatchers.registry import DISPATCHERS

DISPATCHERS.add("deepep", Dispatcher(
    "deepep", "DeepEP: each token over the inter-node link once per destination node, NVLink inside it",
    dispatch=(Step("alltoall_dedup", "ep", "routed"),),
    combine=(Step("alltoall_dedup", "ep", "routed"),),
    megatron="flex", megatron_backend="deepep",
    # its normal (training) kernels: NUM_MAX_NVL_PEERS = 8 GPUs of a node over NVLink, NUM_MAX_RDMA_PEERS = 20 nodes
    # (deep_ep/buffer.py; csrc's buffer check unless low-latency mode); the maintainers: 'the normal mode doesn't
    # support GB200 yet' (deepseek-ai/DeepEP issue 392), not on NVL72 publicly (issue 579, 2026-02)
    max_ranks=160, max_node_gpus=8,
    # Megatron-LM's MoEFlexTokenDispatcher asserts "Flex token dispatcher requires TPxEP > 1" (its TP the experts'
    # TP, which memo's deepep runs at 1: `memo_sim.layout.parallel.expert_why_not`); a review: --moe-dispatcher deepep
    # on an NVL72 answered an ep 1 plan, named deepep, every layout with expert parallelism refused
    min_ranks=2, min_ranks_source="Megatron-LM's flex dispatcher asserts TPxEP > 1 (token_dispatcher.py)",
    limits_source="DeepEP's normal kernels: NUM_MAX_NVL_PEERS 8 x NUM_MAX_RDMA_PEERS 20; no GB200 NVL72 support, "
                  "deepseek-ai/DeepEP issues 392 and 579",
    # Megatron-LM's TransformerConfig.__post_init__ at d98e8a64: ValueError "Flex token dispatcher with deepep backend
    # does not support moe_pad_expert_input_to_capacity" (a review: memo priced and exported the pair)
    pads_to_capacity=False,
    no_padding_source="Megatron-LM refuses --moe-pad-expert-input-to-capacity with the flex dispatcher's deepep "
                      "backend, TransformerConfig at d98e8a64",
    # the SMs its dispatch and combine kernels run on: Megatron-LM sets DeepEP's Buffer.num_sms to
    # moe_flex_dispatcher_num_sms, 20 when unset (MoEFlexTokenDispatcher's DeepEP manager, token_dispatcher.py at
    # d98e8a64: "None -> 20 (DeepEP's historical mcore default ...)")
    sms=20))
