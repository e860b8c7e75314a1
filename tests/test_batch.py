"""The batch dict (``common/batch.py``): rows -> batch, batch -> the model's positional arguments, bad batches
named. Pure NumPy, milliseconds."""
import numpy as np
import pytest

from mindformers_core.common.batch import BATCH_KEYS, check_batch, map_batch, model_args, stack_samples


def test_pairs_stack_into_input_ids_and_labels():
    rows = [(np.arange(4), np.arange(1, 5)), (np.arange(4) + 4, np.arange(5, 9))]
    batch = stack_samples(rows)
    assert list(batch) == ["input_ids", "labels"]
    assert batch["input_ids"].dtype == np.int32 and batch["input_ids"].shape == (2, 4)
    np.testing.assert_array_equal(batch["labels"][1], [5, 6, 7, 8])
    assert [a.shape for a in model_args(batch)] == [(2, 4), (2, 4)]


def test_dict_rows_keep_their_keys_in_model_order_with_gaps_as_none():
    row = {"position_ids": np.arange(3), "input_ids": np.arange(3), "labels": np.arange(3)}
    batch = stack_samples([row, row])
    args = model_args(batch)
    assert len(args) == BATCH_KEYS.index("position_ids") + 1
    assert args[2] is None and args[3].dtype == np.int32       # loss_mask absent, positions given
    masked = stack_samples([dict(row, loss_mask=[0, 1, 1])])
    assert masked["loss_mask"].dtype == np.float32
    assert len(model_args({"input_ids": np.zeros((1, 2))})) == 1          # logits only: ids alone


def test_map_batch_applies_to_every_key():
    batch = stack_samples([(np.arange(6), np.arange(6))])
    cut = map_batch(batch, lambda a: a[:, ::2])
    assert {k: v.tolist() for k, v in cut.items()} == {"input_ids": [[0, 2, 4]], "labels": [[0, 2, 4]]}


@pytest.mark.parametrize("batch, words", [
    ({"labels": np.zeros((1, 2))}, "'input_ids' is missing"),
    ({"input_ids": np.zeros((1, 2)), "attention": np.zeros((1, 2))}, "['attention'] are not known"),
    ({"input_ids": np.zeros((1, 2)), "loss_mask": np.zeros((1, 3))}, "'loss_mask' has shape (1, 3)"),
    ([np.zeros((1, 2))], "must be a dict"),
])
def test_bad_batches_are_named(batch, words):
    with pytest.raises(ValueError) as err:
        check_batch(batch)
    assert words in str(err.value)
