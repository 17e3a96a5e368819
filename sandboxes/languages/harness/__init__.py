"""The languages' trusted harness sources (compiled or copied once per machine by sandboxes/toolchains.py), never
imported: objcheck.py and rust_objcheck.py run as scripts in the jail."""
