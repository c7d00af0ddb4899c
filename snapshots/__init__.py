"""Snapshot stores: where a yielding actor's checkpoint goes and comes back from.

`SnapshotStore` (snapshots.store) states the contract; `LocalSnapshotStore` and `S3SnapshotStore`
implement it; `store_from_url` picks one from configuration.
"""
