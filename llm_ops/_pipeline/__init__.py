"""A job's line, **plan → cache lookup → dispatch → persist → join back → report**, and the
levers beside it.

The line, in the order a job runs it: ``plan`` (render, key, dedupe, look up the cache),
``dispatch`` (send the misses, claimed against other jobs on the cache), ``persist`` (every
answer to the cache as it arrives), ``join`` (every row gets its answer, in order),
``savings`` (the report: what was spent, what each lever saved). ``line`` runs them as one
model's pass and ``run`` runs a job over a frame, recorded as one run; ``backend`` is what a
job runs on (the engine and the cache).

The levers: ``batch`` (the provider's Files and Batches API, chosen in ``dispatch``),
``similar`` and ``vectors`` (the semantic cache, over a pass's misses), ``cascade`` (passes
model after model). Beside the line: ``embed`` (``llm_embed``) and ``estimate`` (a job planned
and priced, nothing sent).
"""
