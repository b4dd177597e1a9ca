"""The King James Bible corpus: extraction from Debian's bible-kjv-text and the held-out split.

The `bible` program (package bible-kjv; the text is bible-kjv-text) prints one verse per line,
prefixed with its reference ("Ge1:3 And God said, ..."). The corpus is the verse text without the
reference, one verse per line, each line ending in "\n". Chapters are numbered in canonical order
(Genesis 1 = 0 ... Revelation 22 = 1188); every chapter whose number is congruent to
HELDOUT_PHASE modulo HELDOUT_EVERY is held out: never seen by the tokenizer trainer or the model.
"""
import re
import subprocess

BIBLE_RANGE = "gen1:1-rev22:21"
HELDOUT_EVERY = 20
HELDOUT_PHASE = HELDOUT_EVERY - 1  # chapters 19, 39, ... (the 20th, 40th, ...)
_VERSE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.*)$")


def read_verses(bible_program="bible"):
    """Returns [(chapter_index, verse_text)] in canonical order."""
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
        verses.append((chapter_index, text.strip()))
    return verses


def split_corpus(verses):
    """Returns (train_text, heldout_text); each verse is one line ending in a newline."""
    train, heldout = [], []
    for chapter_index, text in verses:
        target = heldout if chapter_index % HELDOUT_EVERY == HELDOUT_PHASE else train
        target.append(text + "\n")
    return "".join(train), "".join(heldout)
