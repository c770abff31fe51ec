"""What lakelog stores, and where: object formats, object stores, and the values and errors
every layer shares.

Owns:
    segment.py, batches.py, arrow_records.py, compression.py
                the segment object format and the Kafka RecordBatches it holds
    tier.py     the Parquet tier format (read whole, or by ranged GETs)
    store.py, s3.py, localfs.py, memory.py
                the object-store interface and its ``s3://``, ``file://``, ``memory://``
    partitioning.py  Kafka's key partitioner
    types.py    the values segment objects hold (records, chunks)
    errors.py   the one tree of lakelog's errors: every layer raises them, this one too
                (a corrupt object, a record a topic refuses), so they live at the bottom

The lowest layer: imports nothing of lakelog's other packages (``coordinator``,
``index``, ``service``, ``spark`` all import it).
"""
