"""The King James Bible corpus: extraction from Debian's bible-kjv-text and the held-out split.

The `bible` program (package bible-kjv; the text is bible-kjv-text) prints one verse per line,
prefixed with its reference ("Ge1:3 And God said, ..."). The corpus is the verse text without the
reference, one verse per line, each line ending in "\n". Chapters are numbered in canonical order
(Genesis 1 = 0 ... Revelation 22 = 1188); every chapter whose number is congruent to
HELDOUT_PHASE modulo HELDOUT_EVERY is held out: never seen by the tokenizer trainer or the model.

The LoRA adapters (train_lora.py) each specialize the model in one PART of the corpus (a set of
books). Within a part, every chapter whose number is congruent to PART_HELDOUT_PHASE modulo
PART_HELDOUT_EVERY is held out from the adapter: every 10th chapter of the Bible, so a part's
held-out chapters are spread over it and include all of the base split's chapters in it. A
part's training chapters are then chapters the base model trained on too, and an adapter never
sees any of models/kjv-heldout.txt.
"""
import re
import subprocess
from typing import NamedTuple

BIBLE_RANGE = "gen1:1-rev22:21"
HELDOUT_EVERY = 20
HELDOUT_PHASE = HELDOUT_EVERY - 1  # chapters 19, 39, ... (the 20th, 40th, ...)
PART_HELDOUT_EVERY = 10
PART_HELDOUT_PHASE = PART_HELDOUT_EVERY - 1  # chapters 9, 19, 29, ...: includes 19, 39, ...
# The parts: name -> {`bible`'s book abbreviation: book name}, in canonical order.
PARTS = {
    "psalms": {"Psa": "Psalms"},
    "proverbs": {"Prv": "Proverbs"},
    "gospels": {"Mat": "Matthew", "Mark": "Mark", "Luke": "Luke", "John": "John"},
}
_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


class Verse(NamedTuple):
    book: str           # `bible`'s abbreviation: "Ge", "Psa", "Mat", ...
    chapter: int        # chapter number within the book (from 1)
    chapter_index: int  # canonical chapter number over the whole Bible (from 0)
    text: str


def read_book_verses(bible_program="bible"):
    """Returns [Verse] in canonical order."""
    output = subprocess.run([bible_program, "-f", BIBLE_RANGE], check=True, capture_output=True,
                            text=True).stdout
    verses = []
    chapter_index = -1
    previous = None
    for line in output.splitlines():
        if not line.strip():
            continue
        match = _VERSE.match(line)
        if match is None:
            raise ValueError(f"unexpected line from `bible`: {line!r}")
        book, chapter, _, text = match.groups()
        if (book, chapter) != previous:
            chapter_index += 1
            previous = (book, chapter)
        verses.append(Verse(book, int(chapter), chapter_index, text.strip()))
    return verses


def read_verses(bible_program="bible"):
    """Returns [(chapter_index, verse_text)] in canonical order."""
    return [(verse.chapter_index, verse.text) for verse in read_book_verses(bible_program)]


def is_heldout(chapter_index):
    """Whether the base model's split holds this chapter out."""
    return chapter_index % HELDOUT_EVERY == HELDOUT_PHASE


def split_corpus(verses):
    """Returns (train_text, heldout_text); each verse is one line ending in a newline."""
    train, heldout = [], []
    for chapter_index, text in verses:
        target = heldout if is_heldout(chapter_index) else train
        target.append(text + "\n")
    return "".join(train), "".join(heldout)


def is_part_heldout(chapter_index):
    """Whether a part's split holds this chapter out (true for every base held-out chapter)."""
    return chapter_index % PART_HELDOUT_EVERY == PART_HELDOUT_PHASE


def split_part(verses, part):
    """The verses of PARTS[part]'s books, split as the module docstring says. Returns
    (train_text, heldout_text, train_chapters, heldout_chapters); the texts have one verse per
    line ending in a newline, the chapters are [(book name, chapter, chapter_index)]."""
    books = PARTS[part]
    train, heldout, train_chapters, heldout_chapters = [], [], [], []
    for verse in verses:
        if verse.book not in books:
            continue
        is_held = is_part_heldout(verse.chapter_index)
        if is_heldout(verse.chapter_index) and not is_held:
            raise AssertionError("a part's held-out chapters must include the base split's")
        (heldout if is_held else train).append(verse.text + "\n")
        chapters = heldout_chapters if is_held else train_chapters
        chapter = (books[verse.book], verse.chapter, verse.chapter_index)
        if not chapters or chapters[-1] != chapter:
            chapters.append(chapter)
    return "".join(train), "".join(heldout), train_chapters, heldout_chapters
