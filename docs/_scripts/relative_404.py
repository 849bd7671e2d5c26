"""MkDocs hook: 404.html works opened from disk, under a sub-path, and served for a missing URL at any depth.

MkDocs builds 404.html with the site's root as its base (``/``, or site_url's path), since a server may show it for
a missing page at any depth. pods-rl sets no site_url (the project is not published yet) and its site is read from
disk (file://) or served from a folder, where ``/assets/...`` points at the file system's or the server's root. The
page sits at the site's root, so ``.`` is its base: its links then resolve from where the page is.

A static host serves the same file for a missing ``/no/such/nested/page/``, where ``.`` is that missing folder: the
page came unstyled, with 8 console errors. So the page's stylesheets and scripts are named in ``data-pods-href`` /
``data-pods-src`` (which the browser's preload scanner does not fetch) and loaded by a script, against a ``<base>``
at the site's root that the page's first script adds when the page is not read where it lies (not file://, and the
URL does not end in 404.html); the root is site_url's path if one is set, else the server's root. Material's
configuration (``#__config``, whose ``base`` Material resolves against the location, not ``<base>``) gets the same
root. Read where it lies, the page loads the same files from ``.``.
"""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

# Runs first in <head>: the base (when the page is served away from the site's root) and the loader of the page's
# stylesheets and scripts, which resolves their relative paths against it. Scripts keep their order (async false).
BASE_SCRIPT = """<script>
/* 404.html is served for a missing URL at any depth; its files are named relative to the site's root and loaded
   here against it (docs/_scripts/relative_404.py). Read where it lies, it needs no base. */
(function () {
  var root = null;
  if (location.protocol !== "file:" && !/\\/404\\.html$/.test(location.pathname)) {
    var base = document.createElement("base");
    base.href = root = new URL(%(root)s, location.href).href;
    document.head.appendChild(base);
  }
  window.__pods_site_root = root;
  window.__pods_load = function (scope) {
    scope.querySelectorAll("link[data-pods-href]").forEach(function (link) {
      link.href = new URL(link.getAttribute("data-pods-href"), document.baseURI).href;
    });
    scope.querySelectorAll("script[data-pods-src]").forEach(function (named) {
      var script = document.createElement("script");
      script.src = new URL(named.getAttribute("data-pods-src"), document.baseURI).href;
      script.async = false;
      named.parentNode.insertBefore(script, named);
    });
  };
})();
</script>"""

LOAD_SCRIPT = "<script>__pods_load(document.%s)</script>"

# Material resolves its base against the location, not <base>: served away from the root, give it the root.
CONFIG_SCRIPT = """<script>
(function () {
  if (!window.__pods_site_root) return;
  var element = document.getElementById("__config"), config = JSON.parse(element.textContent);
  config.base = window.__pods_site_root;
  element.textContent = JSON.stringify(config);
})();
</script>"""

CONFIG_ELEMENT = re.compile(r'(<script id="__config" type="application/json">.*?</script>)', re.S)
# The files the page loads: stylesheets and the icon (<link href>), scripts (<script src>).
LINK = re.compile(r'(<link rel="(?:stylesheet|icon)") href=')
SCRIPT = re.compile(r"(<script) src=")


def site_root(config) -> str:
    """The site's root path on a server: site_url's path if set (ending in /), else ``/``."""
    path = urlsplit(config.get("site_url") or "").path or "/"
    return path if path.endswith("/") else path + "/"


def on_template_context(context, template_name, config):
    """Give the 404 page the base ``.`` instead of ``/``."""
    if template_name == "404.html":
        context["base_url"] = "."
    return context


def rebase_404(html: str, root: str) -> str:
    """404.html as built -> the page that loads its files against the site's root ``root`` (a path, e.g. ``/``)."""
    for needed in ("<head>", "</head>", "</body>"):
        if html.count(needed) != 1:
            raise ValueError(f"relative_404: 404.html has {html.count(needed)} {needed} (the theme changed?): "
                             "update docs/_scripts/relative_404.py to the theme's page")
    if not CONFIG_ELEMENT.search(html):
        raise ValueError("relative_404: 404.html has no #__config element (the theme changed?): update "
                         "docs/_scripts/relative_404.py to the theme's page")
    html = SCRIPT.sub(r"\1 data-pods-src=", LINK.sub(r"\1 data-pods-href=", html))
    html = html.replace("<head>", "<head>\n" + BASE_SCRIPT % {"root": json.dumps(root)})
    html = html.replace("</head>", LOAD_SCRIPT % "head" + "\n</head>")
    html = CONFIG_ELEMENT.sub(lambda found: found.group(1) + "\n" + CONFIG_SCRIPT, html, count=1)
    return html.replace("</body>", LOAD_SCRIPT % "body" + "\n</body>")


def on_post_template(output_content, template_name, config):
    """404.html's files loaded by its first script, against the site's root when served away from it."""
    if template_name != "404.html":
        return output_content
    return rebase_404(output_content, site_root(config))
