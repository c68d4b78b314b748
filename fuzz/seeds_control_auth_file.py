"""Writes a seed corpus for fuzz_control_auth_file: valid and near-valid auth files.

Usage: python3 fuzz/seeds_control_auth_file.py DIR
"""

from seeds_control_parse import write

SECRET = b"0123456789abcdef0123456789abcdef"
SEEDS = [
    b"tenant alice secret=" + SECRET + b" max_jobs=4 max_memory=256M\n",
    b"# comment\ndefaults max_jobs=2\ntenant a secret="
    + SECRET
    + b"\noperator ops secret="
    + SECRET
    + b"x\n",
    b"anonymous max_jobs=1 max_memory=1G\r\ntenant b\tsecret=" + SECRET + b"  # trailing\n",
    b"tenant a secret=short\ntenant a secret=" + SECRET + b"\n",
]


if __name__ == "__main__":
    write(SEEDS)
