"""The fast constructors make exactly the objects the dataclasses' own __init__ makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.durable.build import builder
from delayq.durable.message import (
    Message,
    PutRequest,
    Record,
    State,
    new_message,
    new_record,
    put_request,
)

values = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.binary(max_size=5))


@pytest.mark.parametrize(
    ("cls", "build"), [(PutRequest, put_request), (Record, new_record), (Message, new_message)]
)
@given(data=st.data())
def test_a_built_object_equals_the_constructed_one(cls: Any, build: Any, data: Any) -> None:
    fields = {f.name: data.draw(values) for f in dataclasses.fields(cls)}
    fields["state" if "state" in fields else "id"] = (
        data.draw(st.sampled_from(list(State))) if "state" in fields else "m1"
    )
    built, made = build(**fields), cls(**fields)
    assert built == made
    assert build(*fields.values()) == made  # in the fields' order
    assert type(built) is cls
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.id = "other"


@pytest.mark.parametrize("build", [put_request, new_record, new_message])
def test_every_field_must_be_given(build: Any) -> None:
    with pytest.raises(TypeError):
        build(id="m1")


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
class _Referenced:
    """A slot more than its fields (``__weakref__``): built by its descriptors."""

    a: int
    b: str


def test_a_class_with_a_slot_more_than_its_fields_is_built_the_other_way() -> None:
    build = builder(_Referenced)
    built = build(a=1, b="x")
    assert built == _Referenced(1, "x")
    assert type(built) is _Referenced
    assert "_set_a" in build.__code__.co_names
    assert "_set_id" not in put_request.__code__.co_names  # the twin's plain stores
