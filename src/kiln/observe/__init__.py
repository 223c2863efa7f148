"""What a build tells: displays, the manifest, the event log, ``kiln report``.

    summary.py      reporters: readers of the event stream; the plain-line printer and
                    the end-of-build summary
    live.py         the live terminal display (rich)
    event_log.py    ``--events`` (JSON lines), ``--profile`` (Chrome trace) and the
                    record of the last builds kept in ``.kiln/``
    manifest.py     ``manifest.json``: what each entrypoint produced, written from
                    values (``ManifestInputs`` and the ``BuildResult``)
    manifest_history.py  the manifests of the builds before the last (``.kiln/manifests/``)
    report_data.py  what ``kiln report`` shows, read back from the kept builds
    report_html.py  ``kiln report``'s page: one static HTML file

Everything here reads values (events, results, layouts): nothing calls back into
the engine or the facade.
"""
