"""Capture the matplotlib Figures a figure function saves, instead of writing PNGs."""


def capture_saves(monkeypatch, *targets) -> list:
    """Replace each (module, attribute) save function with one that keeps the Figure; return the list."""
    figs: list = []

    def fake_save(fig, path, **_kw):
        figs.append(fig)
        return path

    for module, name in targets:
        monkeypatch.setattr(module, name, fake_save)
    return figs
