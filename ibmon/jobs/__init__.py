"""Jobs: which scheduler jobs run where, and which of them a port's condition touches.

``model`` holds the plain data (a job, the table of running jobs, a job's touch on a link);
``slurm`` asks the scheduler and ``watch`` does so every interval in its own task; ``routes``
turns the switches' forwarding tables into the leaf pairs each switch port carries;
``attribute`` joins jobs, hosts, ports and routes.
"""
