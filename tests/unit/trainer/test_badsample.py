"""A batch that cannot be collated names the sample that differs from the others."""

import numpy as np
import pytest

from paddle_dist.errors import DataError
from paddle_dist.trainer.badsample import NOTE, Guarded, GuardedCollate, odd_samples, span
from paddle_dist.trainer.loading import SampleLoader

SHUFFLED = [350, 300, 12, 7, 344]


class Images:
    """(image, label) pairs, all 3x32x32 but `odd`'s, which has `shape` and `dtype`."""

    def __init__(self, odd=300, shape=(3, 64, 64), dtype="float32"):
        self.odd, self.shape, self.dtype = odd, shape, dtype

    def __getitem__(self, i):
        if i == self.odd:
            return np.zeros(self.shape, self.dtype), np.int64(i)
        return np.zeros((3, 32, 32), "float32"), np.int64(i)

    def __len__(self):
        return 400


def test_a_sample_of_another_shape_is_named_by_its_index_in_a_shuffled_batch():
    with pytest.raises(DataError) as raised:
        list(SampleLoader(Images(), [SHUFFLED]))
    said = str(raised.value)
    assert "sample 300 has float32 [3, 64, 64] in its [0] where the batch's others have float32 [3, 32, 32]" \
        in said, said
    assert "350..344" not in said                   # not a range: a shuffled batch's first and last
    assert said.startswith("collating samples 350, 300, 12, 7, 344 with default_collate_fn failed: ValueError")


def test_in_a_worker_the_note_names_the_sample_too(tmp_path):
    data = Guarded(Images(odd=7), str(tmp_path))
    collate = GuardedCollate(lambda samples: np.stack([s[0] for s in samples]), str(tmp_path))
    with pytest.raises(ValueError):
        collate([data[i] for i in SHUFFLED])
    note = next(tmp_path.glob(f"{NOTE}*")).read_text()
    assert "sample 7 has float32 [3, 64, 64] in its [0] where the batch's others have float32 [3, 32, 32]" \
        in note, note


def test_what_differs_is_named_shape_dtype_fields_or_keys():
    image, other = np.zeros((3, 32, 32), "float32"), np.zeros((3, 32, 32), "float64")
    assert odd_samples([image, image, other], [4, 5, 6]) == \
        "sample 6 has float64 [3, 32, 32] where the batch's others have float32 [3, 32, 32]"
    dicts = [{"img": image, "y": 1}, {"img": image, "y": 2}, {"img": image}]
    assert odd_samples(dicts, [0, 1, 2]) == \
        "sample 2 has a dict of 'img' where the batch's others have a dict of 'img', 'y'"
    assert odd_samples([(image, 1), (image, 2)], [0, 1]) == ""       # alike: the collate's own error stands
    assert odd_samples([(image, 1)], [0, 1]) == ""                   # indices that do not match


def test_samples_that_all_differ_are_listed_with_a_few_indices():
    rows = [np.zeros(n, "int64") for n in (5, 7, 9, 11, 13)]
    said = odd_samples(rows, SHUFFLED)
    assert said == ("the samples differ: sample 350 has int64 [5], sample 300 has int64 [7], sample 12 has "
                    "int64 [9], ... (5 layouts in 5 samples); pad them to one shape in a collate_fn")


def test_span_is_a_range_only_where_the_indices_are_one():
    assert span(list(range(32, 40))) == "32..39"
    assert span([350, 300, 12]) == "350, 300, 12"
    assert span([350, 300, 12, 7, 344, 5]) == "350, 300, 12, 7, ... (6 samples)"
