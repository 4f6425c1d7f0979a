"""fit() on dict samples named like a Llama's forward (input_ids, position_ids=None,
attention_mask=None): the model asserts that the mask reached `attention_mask`.

    by_name.py OUT API [--misnamed] [--forward-names]
        # API: loop or hapi; --misnamed: the samples and the InputSpecs say attn_mask;
        # --forward-names: no InputSpecs, the keys named after forward's parameters are the inputs
"""

import sys

import numpy as np
import paddle
from paddle.static import InputSpec

import paddle_dist

MASK = "attn_mask" if "--misnamed" in sys.argv else "attention_mask"


class LlamaOrder(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.embed = paddle.nn.Embedding(16, 8)
        self.head = paddle.nn.Linear(8, 16)

    def forward(self, input_ids, position_ids=None, attention_mask=None):
        # By position, the mask would arrive here as position_ids.
        assert position_ids is None, "attention_mask reached position_ids"
        assert attention_mask is not None and attention_mask.dtype == paddle.float32
        return self.head(self.embed(input_ids) * attention_mask.unsqueeze(-1))


class Tokens(paddle.io.Dataset):
    def __init__(self, n=32):
        rng = np.random.default_rng(0)
        self.ids = rng.integers(0, 16, (n, 6)).astype("int64")
        self.mask = (np.arange(6)[None, :] < rng.integers(2, 7, (n, 1))).astype("float32")

    def __getitem__(self, i):
        labels = np.where(self.mask[i] > 0, np.roll(self.ids[i], -1), -100).astype("int64")
        return {"input_ids": self.ids[i], MASK: self.mask[i], "labels": labels}

    def __len__(self):
        return len(self.ids)


def token_loss(logits, labels):
    return paddle.nn.functional.cross_entropy(logits, labels.unsqueeze(-1), ignore_index=-100)


def main(out, api):
    paddle.seed(0)
    net = LlamaOrder()
    inputs = [InputSpec([None, 6], "int64", "input_ids"), InputSpec([None, 6], "float32", MASK)]
    if "--forward-names" in sys.argv:
        inputs = None
    result = paddle_dist.fit(net, Tokens(), loss=token_loss, epochs=1, batch_size=8,
                             optimizer=paddle.optimizer.SGD(0.1, parameters=net.parameters()),
                             inputs=inputs, config=paddle_dist.load_config(
                                 overrides=[f"output.run_dir={out}", f"train.api={api}", "train.log_every=1"]))
    print("steps", result.steps)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
