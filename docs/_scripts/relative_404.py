"""MkDocs hook: 404.html's links are relative, so that the page works opened from disk and under a sub-path.

MkDocs builds 404.html with the site's root as its base (``/``, or site_url's path), since a server may show it for
a missing page at any depth. pods-rl sets no site_url (the project is not published yet) and its site is read from
disk (file://) or served from a folder, where ``/assets/...`` points at the file system's or the server's root. The
page sits at the site's root, so ``.`` is its base: its links then resolve from where the page is.
"""

from __future__ import annotations


def on_template_context(context, template_name, config):
    """Give the 404 page the base ``.`` instead of ``/``."""
    if template_name == "404.html":
        context["base_url"] = "."
    return context
