import pandas as pd
import pytest

import posfair

TOPICS = [
    ("apt", "the apt package manager installs and upgrades software packages from configured repositories"),
    ("kernel", "kernel modules are loaded at boot and provide drivers for the hardware of the machine"),
    ("network", "network interfaces are configured in a file that sets addresses routes and name servers"),
    ("grub", "the grub boot loader shows a menu and starts the selected operating system kernel"),
    ("cups", "printing is handled by cups which manages printers queues and print jobs over the network"),
    ("alsa", "sound cards are driven by alsa and the volume is adjusted with a mixer program"),
    ("xorg", "the x window system draws the graphical desktop and talks to the video card"),
    ("users", "user accounts are created with adduser and passwords are changed with passwd"),
    ("disks", "disk partitions are created with a partitioning tool before the file systems are made"),
    ("mirrors", "mirrors are servers that copy the archive so downloads are fast everywhere"),
    ("mail", "electronic mail is delivered by a mail transfer agent such as exim or postfix"),
    ("security", "security updates are published quickly and installed with the usual upgrade command"),
]
GERMAN = {
    "apt": "Wie benutze ich die Paketverwaltung apt?",
    "kernel": "Wie lade ich Kernelmodule?",
    "network": "Wie richte ich Netzwerkschnittstellen ein?",
    "grub": "Wie funktioniert der Bootloader grub?",
    "cups": "Wie drucke ich mit cups?",
    "alsa": "Wie bekomme ich Ton mit alsa?",
    "xorg": "Was ist das X Window System?",
    "users": "Wie lege ich Benutzerkonten an?",
    "disks": "Wie partitioniere ich Festplatten?",
    "mirrors": "Was sind Spiegelserver?",
    "mail": "Wie wird E-Mail zugestellt?",
    "security": "Wie installiere ich Sicherheitsaktualisierungen?",
}


def aligned_corpus() -> pd.DataFrame:
    """A tiny aligned en/de corpus: one segment per topic, titles are questions."""
    rows = []
    for key, body in TOPICS:
        text = (
            f"{body.capitalize()}. "
            + f"This paragraph explains more about {key} and how it is used on a typical system. " * 2
        )
        rows.append(
            {
                "id": f"faq/{key}",
                "lang": "en",
                "title": f"How do I use {key}?",
                "text": text,
                "n_tokens_minilm": len(text.split()) + 10,
            }
        )
        rows.append(
            {
                "id": f"faq/{key}",
                "lang": "de",
                "title": GERMAN[key],
                "text": "Dieser Abschnitt erklärt " + key + ". " + text,
                "n_tokens_minilm": len(text.split()) + 14,
            }
        )
    return pd.DataFrame(rows)


@pytest.fixture(scope="session")
def model():
    return posfair.load_model(device="cpu")


@pytest.fixture()
def corpus_df():
    return aligned_corpus()


def build_cli_benchmark(tmp_path):
    """``posfair build-benchmark`` on :func:`aligned_corpus` (en, de; 3 sections; no token budget) into ``tmp_path/bench``."""
    from typer.testing import CliRunner

    from posfair.cli import app

    src = tmp_path / "corpus.jsonl"
    aligned_corpus().to_json(src, orient="records", lines=True)
    args = [
        "build-benchmark",
        "--corpus",
        str(src),
        "--out",
        str(tmp_path / "bench"),
        "--langs",
        "en,de",
        "--k",
        "3",
        "--max-doc-tokens",
        "0",
    ]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return tmp_path / "bench"
