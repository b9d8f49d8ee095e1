from slugger import SlugRegistry


def test_collisions_get_suffixes():
    reg = SlugRegistry()
    assert reg.claim("Release Notes") == "release-notes"
    assert reg.claim("release notes!") == "release-notes-2"
    assert reg.claim("Release  Notes") == "release-notes-3"
    assert len(reg) == 3


def test_release_frees_slug():
    reg = SlugRegistry()
    slug = reg.claim("About")
    reg.release(slug)
    assert slug not in reg
    assert reg.claim("About") == "about"


def test_empty_title_falls_back():
    reg = SlugRegistry()
    assert reg.claim("???") == "item"
