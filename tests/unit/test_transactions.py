"""punctual.dal.common's transactions: every TransactWriteItems carries its own idempotency
token, and a cancellation comes out as the one outcome the caller acts on (ConditionFailed
with every action's code, Retryable for a conflict or throttling, the ClientError itself for
anything else: never a retry of a request that can never succeed)."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from punctual.dal.common import ConditionFailed, Dynamo, Label, Transactions, transact
from punctual.domain.errors import Retryable
from tests.fakes import as_client

ACTIONS: list[tuple[Label, dict[str, Any]]] = [
    (Label.FENCE, {"ConditionCheck": {}}),
    (Label.OCCURRENCE, {"Put": {}}),
]


class Client:
    """A DynamoDB client whose TransactWriteItems records each request and answers with
    ``error`` (None: it commits)."""

    def __init__(self, error: dict[str, Any] | None = None) -> None:
        self.error = error
        self.requests: list[dict[str, Any]] = []

    def transact_write_items(self, **request: Any) -> dict[str, Any]:
        self.requests.append(request)
        if self.error is not None:
            raise ClientError(self.error, "TransactWriteItems")
        return {}


def _cancelled(*reasons: dict[str, Any] | None) -> dict[str, Any]:
    error: dict[str, Any] = {
        "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"}
    }
    if reasons != (None,):
        error["CancellationReasons"] = list(reasons)
    return error


def test_each_transaction_carries_its_own_idempotency_token() -> None:
    # GIVEN two transactions sent one after the other
    client = Client()
    transact(Dynamo(as_client(client)), [{"Put": {}}])
    transact(Dynamo(as_client(client)), [{"Put": {}}])
    # THEN each has a token (the SDK's resend of a committed call whose answer was lost is
    # then answered as the success it was, not refused by its own write), and not the same
    # one (a second transaction with the first's token would be taken for its resend)
    tokens = [r["ClientRequestToken"] for r in client.requests]
    assert all(len(t) == 32 and int(t, 16) >= 0 for t in tokens)
    assert tokens[0] != tokens[1]


def test_a_failed_condition_names_its_action_and_every_actions_code() -> None:
    # GIVEN a transaction whose second action's condition failed; DynamoDB left the first
    # action's code out
    client = Client(_cancelled({}, {"Code": "ConditionalCheckFailed", "Item": {"v": {"N": "2"}}}))
    # WHEN it is committed
    with pytest.raises(ConditionFailed) as refused:
        Transactions(client).commit(ACTIONS)
    # THEN the refusal names the occurrence action, with the item as it was, and the first
    # action counts as not at fault
    assert refused.value.label == Label.OCCURRENCE
    assert refused.value.old_item == {"v": 2}
    assert refused.value.codes == ("None", "ConditionalCheckFailed")
    assert refused.value.innocent(0)
    assert refused.value.failed(1)


@pytest.mark.parametrize("code", ["TransactionConflict", "ThrottlingError"])
def test_a_transaction_cancelled_by_a_conflict_or_throttling_may_be_tried_again(code: str) -> None:
    client = Client(_cancelled({"Code": "None"}, {"Code": code}))
    with pytest.raises(Retryable):
        Transactions(client).commit(ACTIONS)


@pytest.mark.parametrize(
    "error",
    [
        # an action DynamoDB can never take (an item over 400 KB, a bad expression)
        _cancelled({"Code": "None"}, {"Code": "ValidationError"}),
        # a cancellation without its reasons
        _cancelled(None),
    ],
    ids=["validation", "no-reasons"],
)
def test_a_transaction_cancelled_for_any_other_reason_is_the_error_itself(
    error: dict[str, Any],
) -> None:
    # WHEN a transaction is cancelled for a reason no retry mends
    client = Client(error)
    # THEN the caller gets DynamoDB's error: not a Retryable it would send again forever
    with pytest.raises(ClientError) as raised:
        Transactions(client).commit(ACTIONS)
    assert raised.value.response["Error"]["Code"] == "TransactionCanceledException"
    assert len(client.requests) == 1


def test_a_refusal_tells_an_action_that_met_another_transaction_from_a_failed_one() -> None:
    # GIVEN a transaction whose first action met another transaction on its item and whose
    # second action's condition failed
    client = Client(_cancelled({"Code": "TransactionConflict"}, {"Code": "ConditionalCheckFailed"}))
    # WHEN it is committed
    with pytest.raises(ConditionFailed) as refused:
        Transactions(client).commit(ACTIONS)
    # THEN the first action is the one that conflicted (the materializer retries its step as
    # it was, catch-up pace kept, instead of re-reading it), neither failed nor innocent
    assert refused.value.conflicted(0)
    assert not refused.value.failed(0)
    assert not refused.value.innocent(0)
    assert not refused.value.conflicted(1)
