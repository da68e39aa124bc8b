"""split_eval and gather invariants (seperate_test_set.py / do_gather.py quirks)."""

from __future__ import annotations

import random

import pytest

from core.errors import InputError
from preprocessing.text.gather import gather_content
from preprocessing.text.split_eval import eval_md5_line, num_tests_for, pick_test_ids, split_text

TEXT = "\nA one.\nA two.\n\nB one.\n\nC one.\nC two.\n\n"  # a .3 file: 3 articles + the empty trailing one


def test_num_tests_sum_to_the_total() -> None:
    for files, total in ((13418, 10000), (3, 20), (4, 20), (7, 3)):
        counts = [num_tests_for(k, files, total) for k in range(files)]
        assert sum(counts) == total
    assert set(num_tests_for(k, 13418, 10000) for k in range(13418)) == {0, 1}


def test_split_is_a_partition_in_file_order() -> None:
    articles = TEXT.split("\n\n")
    for file_id in range(30):
        train, tests = split_text(TEXT, file_id, 30, 60)  # 2 test articles per file
        assert len(tests) == 2
        kept = train.split("\n\n")[:-1]
        assert sorted(kept + tests) == sorted(articles)
        assert [a for a in articles if a in kept] == kept and [a for a in articles if a in tests] == tests
        assert train == "".join(a + "\n\n" for a in kept)


def test_the_empty_trailing_article_can_be_withheld() -> None:
    """The quirk behind the 60 md5("") lines of the official eval.md5."""
    train, tests = split_text(TEXT, 5, 40, 40)  # file 5 of 40, one test article: the empty one
    assert tests == [""] and train == TEXT  # every real article kept; without it a .4 ends "\n\n\n\n"
    assert split_text(TEXT, 0, 1, 0) == (TEXT + "\n\n", [])
    assert eval_md5_line("") == "d41d8cd98f00b204e9800998ecf8427e\n"


def test_draw_is_the_reference_rng() -> None:
    rng = random.Random(12345 + 13 * 2)
    expected: list[int] = []
    while len(expected) < 3:
        new = int(rng.random() * 10)
        if new not in expected:
            expected.append(new)
    assert pick_test_ids(10, 3, 12345 + 13 * 2) == expected


def test_too_many_test_articles() -> None:
    with pytest.raises(InputError, match="holds only 4"):
        split_text(TEXT, 0, 1, 5, name="x.3")


def test_gather_content_rules() -> None:
    assert gather_content("a\n\nb\n\n") == "a\n\nb\n"  # one final newline dropped
    assert gather_content("a\nb\n") == "a\nb\n"
    assert gather_content("\ufeffa\r\nb\rc\n\n") == "a\nb\nc\n"  # utf-8-sig, universal newlines
    with pytest.raises(InputError, match="holds 1 characters"):
        gather_content("\n", "AA/wiki_00.4")
