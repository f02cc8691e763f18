"""FedBN: batch-normalisation layers stay local, everything else is averaged (Li et al., ICLR 2021).

- Client: plain local SGD. Every state entry of a BatchNorm module (weight, bias, running mean,
  running variance, batch counter `num_batches_tracked`) is kept in `context.state` after the
  round; in the next round the client ignores the received BN entries and replaces them with its
  own, so its BN state is its own across rounds. The reply carries the full model (same array
  count and shapes as sent), with the local BN values, which the server discards.
- Server (`strategies/fedbn.py`): the weighted mean of the non-BN entries. The BN entries of the
  model it sends never change (they stay at their initial values), so no client's BN state
  reaches another client; a client sampled for the first time starts from the initial BN.
- Server evaluation needs some BN state: it uses the weighted mean of the round's client BN
  entries, for evaluation only (never sent).
- State: BN entries per client. Keys: none of its own.
- Needs a model with BatchNorm (`cnn-bn`, `lenet-bn`, `resnet18-bn`): a model without BN,
  `cnn` included, is refused before training with a message naming its BN twin, never swapped
  silently, so a comparison that says "the same model" ran the same model. Set the twin for
  FedBN alone, e.g. `model = "cnn-bn"` in an experiment file's `[methods.fedbn]`.

Summary: client own BN entries | server BN entries not averaged | client state BN entries |
server state - | traffic -
"""

from __future__ import annotations

from protocol.layout import bn_names
from tasks.functional.core import plain_direction
from tasks.functional.update import Arrays, LocalUpdate

# FedAvg's step; the BN entries (weights, biases and running statistics) are the client's own.
UPDATE = LocalUpdate("fedbn", plain_direction, personal=Arrays(bn_names, record="fedbn-bn"), module=__name__)
