"""The fast constructors make exactly the objects the dataclasses' own __init__ makes,
and the record replacer exactly what ``dataclasses.replace`` makes."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayq.durable.build import builder, replacer
from delayq.durable.message import (
    Message,
    PutRequest,
    Record,
    State,
    new_message,
    new_record,
    put_request,
    replace_record,
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


@given(data=st.data())
def test_a_replaced_record_equals_what_dataclasses_replace_makes(data: Any) -> None:
    names = [f.name for f in dataclasses.fields(Record)]
    record = new_record(*(data.draw(values) for _ in names))
    changes = {name: data.draw(values) for name in data.draw(st.sets(st.sampled_from(names)))}
    if "state" in changes:
        changes["state"] = data.draw(st.sampled_from(list(State)))
    replaced, expected = replace_record(record, **changes), dataclasses.replace(record, **changes)
    assert replaced == expected
    assert type(replaced) is Record
    assert replaced is not record
    assert all(getattr(replaced, n) is getattr(expected, n) for n in names)  # the same objects
    with pytest.raises(dataclasses.FrozenInstanceError):
        replaced.id = "other"


def test_a_replacer_refuses_what_dataclasses_replace_refuses() -> None:
    record = new_record(*range(12))
    with pytest.raises(TypeError):
        replace_record(record, nothing=1)
    with pytest.raises(TypeError):
        replace_record(record, "positional")
    with pytest.raises(TypeError):
        replacer(dict)


@dataclasses.dataclass(frozen=True, slots=True)
class _Derived:
    a: int
    b: int = dataclasses.field(init=False, default=0)


def test_a_class_with_a_field_outside_init_has_no_replacer() -> None:
    with pytest.raises(TypeError):
        replacer(_Derived)
