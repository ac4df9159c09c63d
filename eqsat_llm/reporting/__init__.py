"""Reports: what the optimizer chose and why.

    report        the Report of one optimization (op counts, costs, rules, e-graph size,
                  memory, time per phase) and its text summary
    decisions     a kernel entry per node of the program: cost, rules, alternatives, sharing
    alternatives  each alternative's price as the whole program's change
    explain       explain one kernel in words; diff two reports
    html          the HTML page
    units         times and sizes in human units
"""
