"""peers.py, part: the constants, the run log and PeerSkip shared by every part."""

from pathlib import Path


REPO = Path(__file__).resolve().parents[3]
SHAPES = {"A": (2048, 62080), "B": (4096, 37984), "C": (5120, 37984), "D": (2048, 151936),
          "E": (4096, 128256)}
# Peers that compute their gradients inside the forward, so need the upstream gradient before
# it (a scalar here): not usable where the loss needs the log-probs first (PPO/GRPO ratios).
ONE_PASS_PEERS = {"liger-sum", "quack", "quack-compact", "liger-cute", "liger-cute-compact"}
COMPACT = {"quack-compact", "liger-cute-compact"}
CUTE_PEERS = {"quack", "quack-compact", "liger-cute", "liger-cute-compact"}
TRITON_PEERS = {"liger-sum", "liger-none", "cce", "cce-exact", "verl"}

LOGPROB_IMPLS = ["spanhead", "spanhead-onepass", "torch-eager", "liger-sum", "liger-none",
                 "cce", "cce-exact", "verl", "quack", "quack-compact", "liger-cute",
                 "liger-cute-compact"]
POLICY_IMPLS = ["spanhead+torch", "spanhead-policy", "spanhead-onepass", "torch-eager-policy",
                "liger-grpo"]
IMPLS = LOGPROB_IMPLS + [i for i in POLICY_IMPLS if i not in LOGPROB_IMPLS]
MODE_IMPLS = {"logprob": LOGPROB_IMPLS, "policy": POLICY_IMPLS}
# the references of the checks, in order of preference, run first
REF_ORDER = {"logprob": ("spanhead", "torch-eager", "spanhead-onepass"),
             "policy": ("spanhead+torch", "torch-eager-policy", "spanhead-policy")}
MASKS = ["response", "fragmented", "packed-rl"]
CHECK_TOL = 5e-2
POLICY_LOSS_TOL = 1e-2   # |loss - reference loss|, absolute (the loss is a token mean, O(0.1))
SEQ = 2048        # response masks: the last active*SEQ rows of each SEQ-row sequence
FRAG_RUN = 16     # fragmented masks: runs of 16 active rows, evenly spaced (as spanhead bench)
GIB = float(1 << 30)
QUACK_ROW_ALIGN = 8      # quack's base pipeline asserts M % 8 == 0
QUACK_SE_ALIGN = 128     # its scaled-exp pipeline pads each chunk to 128 rows


_LOG = []   # the open log file, once the output folder exists


def log(msg):
    print(msg, flush=True)
    if _LOG:
        _LOG[0].write(msg + "\n")
        _LOG[0].flush()


class PeerSkip(Exception):
    """A peer that cannot run this point by design (a shape it rejects, no GPU): a
    'skipped: ...' row, not a failure."""
