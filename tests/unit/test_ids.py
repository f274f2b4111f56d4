"""Global ids: ASCII, at most 32 bytes, deterministic, and distinct for distinct messages."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from oncemesh.common import ids
from oncemesh.common.ids import (
    GID_MAX,
    counter_tag,
    global_id,
    is_control_tag,
    plid_of,
    publisher_link_id,
    subscription_id,
)


@given(st.text(max_size=80), st.text(max_size=80), st.binary(max_size=64))
def test_gid_fits_a_delivery_tag_and_is_ascii(container: str, link: str, tag: bytes) -> None:
    plid = publisher_link_id(container, link)
    gid = global_id(plid, tag)
    raw = gid.encode("ascii")  # raises if not ASCII
    assert len(raw) <= GID_MAX
    assert '"' not in gid and "\\" not in gid
    assert plid_of(gid) == plid
    assert global_id(plid, tag) == gid  # deterministic: a resend has the same id anywhere
    assert not is_control_tag(raw)


@given(st.binary(max_size=40), st.binary(max_size=40))
def test_distinct_tags_give_distinct_gids(a: bytes, b: bytes) -> None:
    plid = publisher_link_id("c", "l")
    if a != b:
        assert global_id(plid, a) != global_id(plid, b)


@given(st.integers(0, 10**15))
def test_counter_tags_are_short_ascii_and_readable_in_gids(n: int) -> None:
    tag = counter_tag(n)
    assert int(tag.decode(), 36) == n
    plid = publisher_link_id("c", "l")
    assert global_id(plid, tag) == f"{plid}:{tag.decode()}"


def test_identities_separate_their_fields() -> None:
    assert publisher_link_id("a", "bc") != publisher_link_id("ab", "c")
    assert subscription_id("c", "l", "t1") != subscription_id("c", "l", "t2")
    assert len(subscription_id("c", "l", "t")) == 16


_TAGS = st.binary(max_size=24) | st.text(alphabet="0123456789abcxyzABZ:#_-\"\\ é", max_size=22).map(str.encode)


@given(_TAGS)
def test_the_fast_path_of_global_id_agrees_with_the_rule(tag: bytes) -> None:
    """Short printable tags without quote or backslash are kept as they are; any other is hashed."""
    plid = "p" * ids.PLID_LEN
    gid = ids.global_id(plid, tag)
    if ids._PLAIN_TAG.fullmatch(tag):
        assert gid == f"{plid}:{tag.decode('ascii')}"
    else:
        assert gid.startswith(plid + "#")


@given(st.text(alphabet="0123456789abcxyzABZ:#_-é", max_size=8))
def test_the_fast_path_of_counter_seq_agrees_with_the_rule(tag: str) -> None:
    """Only canonical base36 (lower case, no leading zero) is a counter tag."""
    expected = int(tag, 36) if ids._COUNTER.fullmatch(tag) else None
    assert ids.counter_seq("p" * ids.PLID_LEN + ":" + tag) == expected
