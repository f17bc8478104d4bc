"""`roll recipes` descriptions: whole sentences, one line each."""

from __future__ import annotations

from roll.pipelines.recipes import _description, list_recipes


def test_description_keeps_the_lines_that_finish_its_sentence():
    text = "# First line of a sentence that goes\n# on here. Then more,\n# and more.\n# A second sentence.\nkey: 1\n"
    assert _description(text) == "First line of a sentence that goes on here. Then more, and more."
    assert _description("# One line; done\n#\n# details\nkey: 1\n") == "One line; done"
    assert _description("#\n# after a blank comment line\nkey: 1\n") == "after a blank comment line"
    assert _description("key: 1\n# not leading\n") == ""


def test_built_in_recipe_descriptions_are_not_cut_mid_sentence():
    recipes = list_recipes()
    # A first line without a full stop is a whole description (see the helper's cases above).
    assert recipes["sft-tiny-partial"].endswith("learns the format fully, the one-digit facts in part")
    assert all(description and "\n" not in description for description in recipes.values())
