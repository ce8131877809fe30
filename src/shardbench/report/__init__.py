"""Reports of any folder of runs (a sweep's store, or run directories side by side): what each run measured
(`content`), the speed finding first (`speed`) and the other findings (`findings`), charts (`plots`), the
report.md / report.html / PNG files (`write`, `html`) and the lines `shardbench sweep` prints (`terminal`);
`shardbench report` is `report_cmd`."""
