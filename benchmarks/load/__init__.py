"""`make load`: the service measured under a many-tenant load (issue 41, items 2 and 3).

A coordinator (`__main__`) starts the servers (`deployment`: one, or two replicas on PostgreSQL)
and client processes apart from them (`worker`: a closed loop per session over the mix of `mix`,
each session checked against its `model`, and the watchers), samples the servers while they run
(`runner`), and reports (`analysis`, `report`); with --scaling, the same at several numbers of
sessions, beside the SDK used directly (`anchor`). docs/benchmarks.md says what it measures.
"""
